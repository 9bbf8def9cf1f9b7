// `r3 serve`: the model behind the HTTP server (server/http_server.h) until SIGINT or SIGTERM.
// Built only where the HTTP layer's libraries are (R3_WITH_HTTP); elsewhere the command says so.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/engine_cli_options.h"
#include "cli/model_options.h"
#include "cli/option_checks.h"
#include "core/check.h"
#if R3_WITH_HTTP
#include "server/engine_loop.h"
#include "server/http_server.h"
#endif

namespace r3::cli {

namespace {

struct ServeOptions {
  ModelOptions model;
  EngineCliOptions engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;  // default: the model folder's name
  int64_t max_body_mb = 64;
  int timeout_seconds = 30;
  double shutdown_timeout_seconds = 30;
};

#if R3_WITH_HTTP
int run_serve(const ServeOptions& o) {
  // SIGINT and SIGTERM reach one thread, which stops the server: a handler could not call
  // anything that is not async-signal-safe.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // inherited by every thread started below

  auto ctx = o.model.make_context();
  const int ranks = o.engine.engine.expert_parallel;
  auto model = o.model.load(*ctx, 0, ranks);
  engine::Engine engine(*model, *ctx, o.engine.options(), o.model.rank_placer(ranks));
  server::EngineLoop loop(engine);
  server::ServerOptions options;
  options.model_name = o.served_model_name.empty() ? std::filesystem::path(o.model.model_dir).filename().string()
                                                   : o.served_model_name;
  options.api_key = o.api_key;
  options.max_body_bytes = o.max_body_mb << 20;
  options.read_timeout_seconds = options.write_timeout_seconds = o.timeout_seconds;
  const int64_t descriptors = server::raise_open_file_limit();
  server::HttpServer http(loop, model->info(), options);
  const int port = http.bind(o.host, o.port);
  spdlog::info("serve: {} on http://{}:{} ({} running, {} queued at most, {} connections at most{})", options.model_name,
               o.host, port, engine.options().scheduler.max_running, engine.options().scheduler.max_waiting, descriptors - 64,
               o.api_key.empty() ? "" : ", API key required");
  std::atomic<bool> served{false};
  std::thread stopper([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    if (served) return;
    spdlog::info("serve: signal {}: no new connections; the requests in flight have {} s to finish (a second "
                 "signal exits at once)", signal, o.shutdown_timeout_seconds);
    std::thread([stop_signals] {
      int again = 0;
      sigwait(&stop_signals, &again);
      spdlog::warn("serve: signal {} again: exiting now", again);
      spdlog::default_logger()->flush();
      std::_Exit(128 + again);
    }).detach();
    http.shutdown(std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_timeout_seconds * 1000)));
  });
  http.serve();
  served = true;
  spdlog::info("serve: stopped");
  if (stopper.joinable()) {
    pthread_kill(stopper.native_handle(), SIGTERM);  // serve() ended on its own: release the waiter
    stopper.join();
  }
  return 0;
}
#endif

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "HTTP server: SGLang's /generate with routed experts, /v1/models, /health (token ids in and out)");
  o->model.add_to(*cmd);
  o->engine.add_to(*cmd);
  cmd->add_option("--max-queued-requests", o->engine.engine.scheduler.max_waiting,
                  "Same as --max-waiting: samples that may wait for admission; beyond, requests get 503")
      ->check(at_least<int64_t>(1))
      ->excludes("--max-waiting");
  cmd->add_option("--host", o->host, "Address to listen on (loopback unless you say otherwise)")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on; 0 = any free port (logged)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "Require Authorization: Bearer KEY on every endpoint but /health");
  cmd->add_option("--served-model-name", o->served_model_name, "The model's name in /v1/models (default: its folder)");
  cmd->add_option("--max-body-mb", o->max_body_mb, "Largest request body, in MiB (larger: 413)")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_option("--timeout", o->timeout_seconds,
                  "Seconds a client may stay silent while sending its request or not read the answer")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout_seconds,
                  "On SIGINT/SIGTERM: seconds the requests in flight have to finish before they are ended")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  return [o]() -> int {
#if R3_WITH_HTTP
    return run_serve(*o);
#else
    R3_FAIL("this r3 was built without the HTTP server (Boost.Beast or zlib was not found at build time)");
#endif
  };
}

}  // namespace r3::cli
