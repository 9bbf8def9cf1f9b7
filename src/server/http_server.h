// `r3 serve`'s HTTP layer (cpp-httplib, Debian's libcpp-httplib-dev: a thread-pool HTTP/1.1
// server with read/write timeouts and a body-size limit, so a slow, silent or oversized client
// cannot hold a worker or memory). It parses, validates and answers; the engine, on its own
// thread behind EngineLoop, schedules. Endpoints so far: GET /health, GET /v1/models,
// POST /generate (SGLang's format), POST /v1/completions (vLLM's, token ids) and GET /metrics
// (Prometheus). With an API key, every endpoint but /health needs
// `Authorization: Bearer KEY` (compared in constant time).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "models/model_info.h"
#include "server/engine_loop.h"
#include "server/sglang_api.h"

namespace r3::server {

struct ServerOptions {
  std::string model_name;          // what /v1/models lists
  std::string api_key;             // empty: no authentication
  int64_t max_body_bytes = 64 << 20;
  int read_timeout_seconds = 30;   // a client that sends nothing for this long is dropped
  int write_timeout_seconds = 30;  // likewise for one that reads nothing
  // Request workers: each holds its request until the answer is sent, so this bounds the
  // requests in flight (the engine batches only what reaches it). r3 serve sizes it from
  // --max-running.
  int64_t worker_threads = 64;
  // Request headers: more fields or more bytes in all is a 431 (each line is also limited to
  // 8 KiB by cpp-httplib, a 400).
  int64_t max_header_fields = 100;
  int64_t max_header_bytes = 64 << 10;
  ApiLimits limits;
};

class HttpServer {
 public:
  HttpServer(EngineLoop& loop, const models::ModelInfo& info, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: any free port) and returns the port; throws r3::Error when it cannot.
  int bind(const std::string& host, int port);
  // Serves until stop() (from another thread or a signal handler's thread).
  void serve();
  // Whether serve() is accepting connections.
  bool running() const;
  // Stops accepting connections; requests in flight go on.
  void stop();
  // A graceful stop (SIGTERM): stop(), then the requests in flight have `grace` to finish; those
  // still running after it end with an abort (their clients get what was generated, finish
  // reason "abort"). Returns once serve() has returned or the grace is over.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Equal strings, in time that depends only on their lengths (API keys).
bool equal_in_constant_time(const std::string& a, const std::string& b);

}  // namespace r3::server
