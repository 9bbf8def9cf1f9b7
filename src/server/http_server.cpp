#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "core/check.h"
#include "io/json_file.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace r3::server {

using nlohmann::json;

bool equal_in_constant_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

struct HttpServer::Impl {
  EngineLoop& loop;
  models::ModelInfo info;
  ServerOptions options;
  httplib::Server http;
  std::atomic<int64_t> next_id{0};
  ServerMetrics metrics;
  std::mutex serving_mutex;
  std::condition_variable serving_ended_cv;
  bool serving_ended = false;
  int port = 0;
  // A graceful shutdown has begun: the listener is closed by cpp-httplib itself, so stop() must
  // not close its descriptor again (the number may belong to a client's connection by then).
  std::atomic<bool> draining{false};
  // Each endpoint's method, for a 405 (with Allow) rather than a 404 on a known path.
  std::map<std::string, std::string> methods = {{"/health", "GET"},  {"/v1/models", "GET"},     {"/metrics", "GET"},
                                                {"/generate", "POST"}, {"/v1/completions", "POST"}};

  Impl(EngineLoop& l, const models::ModelInfo& i, ServerOptions o) : loop(l), info(i), options(std::move(o)) {}

  // Invalid UTF-8 (a client's bytes quoted in a message) is replaced rather than thrown on.
  static std::string text_of(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }
  static void reply_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(text_of(body), "application/json");
  }
  static void reply_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "") {
    reply_json(res, status, error_body(status, message, param));
  }

  // Why the request's headers are refused ("" when they are within the limits).
  std::string headers_over_limits(const httplib::Request& req) const {
    if (static_cast<int64_t>(req.headers.size()) > options.max_header_fields) {
      return "the request has " + std::to_string(req.headers.size()) + " header fields; the server accepts " +
             std::to_string(options.max_header_fields);
    }
    int64_t bytes = 0;
    for (const auto& [name, value] : req.headers) bytes += static_cast<int64_t>(name.size() + value.size() + 4);
    if (bytes > options.max_header_bytes) {
      return "the request's headers are " + std::to_string(bytes) + " bytes; the server accepts " +
             std::to_string(options.max_header_bytes);
    }
    return "";
  }

  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    return equal_in_constant_time(req.get_header_value("Authorization"), "Bearer " + options.api_key);
  }

  // The body through r3's JSON reader: nesting deeper than kMaxJsonDepth is refused while parsing.
  static json parse_body(const httplib::Request& req) {
    try {
      return parse_json(req.body, "the request body");
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
  }

  // Runs the requests together (submitted as one group, EngineLoop::submit_all) and returns each
  // one's outputs. A refused request (the engine's reason: a 400, or a 503 for a full queue)
  // refuses the whole group.
  std::vector<std::vector<engine::RequestOutput>> run_all(const std::vector<engine::RequestParams>& requests,
                                                          const std::string& param) {
    struct Pending {
      std::mutex mutex;
      std::condition_variable done;
      std::vector<engine::RequestOutput> outputs;
      bool finished = false;
      std::optional<RequestClock> clock;
    };
    std::vector<std::unique_ptr<Pending>> pending;
    for (std::size_t i = 0; i < requests.size(); ++i) pending.push_back(std::make_unique<Pending>());
    const auto wait = [](Pending& p) {
      std::unique_lock lock(p.mutex);
      p.done.wait(lock, [&] { return p.finished; });
    };
    std::vector<EngineLoop::Sink> sinks;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      Pending& mine = *pending[i];
      mine.clock.emplace(static_cast<int64_t>(requests[i].prompt.size()));
      sinks.push_back([&mine](const engine::RequestOutput& out) {
        std::lock_guard lock(mine.mutex);
        mine.clock->observe(out);
        mine.outputs.push_back(out);
        mine.finished = out.finished;
        if (out.finished) mine.done.notify_all();
      });
    }
    try {
      loop.submit_all(requests, std::move(sinks));
    } catch (const Error& e) {
      const bool queue_full = std::string(e.what()).find("queue is full") != std::string::npos;
      throw ApiError(queue_full ? 503 : 400, e.what(), param);
    }
    std::vector<std::vector<engine::RequestOutput>> outputs;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      Pending& p = *pending[i];
      wait(p);
      metrics.record(p.clock->timing());
      outputs.push_back(std::move(p.outputs));
    }
    return outputs;
  }

  void generate(const httplib::Request& req, httplib::Response& res) {
    const GenerateRequest request = parse_generate(parse_body(req), info, options.limits);
    const auto outputs = run_all(request.prompts, "input_ids");
    json answers = json::array();
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      answers.push_back(generate_response(request.prompts[i], gather_sample(outputs[i]), info, request.return_logprob,
                                          std::to_string(next_id++)));
    }
    reply_json(res, 200, request.batch ? answers : answers.front());
  }

  // A streamed completion: every prompt submitted, then each step's outputs sent as server-sent
  // events as they come, `data: [DONE]` last. A client that stops reading (or goes away) ends
  // its requests.
  void stream_completions(const CompletionRequest& request, httplib::Response& res) {
    struct Stream {
      std::mutex mutex;
      std::condition_variable ready;
      std::deque<std::pair<std::size_t, engine::RequestOutput>> queue;  // (prompt, output)
      std::size_t unfinished = 0;
      std::vector<engine::RequestId> ids;
      std::vector<RequestClock> clocks;  // per prompt
    };
    auto st = std::make_shared<Stream>();
    for (const engine::RequestParams& p : request.prompts) st->clocks.emplace_back(static_cast<int64_t>(p.prompt.size()));
    std::vector<EngineLoop::Sink> sinks;
    for (std::size_t p = 0; p < request.prompts.size(); ++p) {
      sinks.push_back([st, p](const engine::RequestOutput& out) {
        std::lock_guard lock(st->mutex);
        st->clocks[p].observe(out);
        st->queue.emplace_back(p, out);
        if (out.finished) --st->unfinished;
        st->ready.notify_all();
      });
    }
    {
      std::lock_guard lock(st->mutex);
      st->unfinished = request.prompts.size();
    }
    try {
      st->ids = loop.submit_all(request.prompts, std::move(sinks));
    } catch (const Error& e) {
      const bool queue_full = std::string(e.what()).find("queue is full") != std::string::npos;
      throw ApiError(queue_full ? 503 : 400, e.what(), "prompt");
    }
    const std::string id = "cmpl-" + std::to_string(next_id++);
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
    auto provider = [this, st, request, id, created](std::size_t, httplib::DataSink& sink) {
      const auto send = [&sink](const json& event) {
        const std::string line = "data: " + text_of(event) + "\n\n";
        return sink.write(line.data(), line.size());
      };
      std::unique_lock lock(st->mutex);
      st->ready.wait(lock, [&] { return !st->queue.empty() || st->unfinished == 0; });
      if (st->queue.empty()) {  // every request finished and every output sent
        int64_t prompt_tokens = 0, completion_tokens = 0;
        for (const RequestClock& clock : st->clocks) {
          prompt_tokens += clock.timing().prompt_tokens;
          completion_tokens += clock.timing().generation_tokens;
          metrics.record(clock.timing());
        }
        lock.unlock();
        if (request.include_usage) {
          send({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", options.model_name},
                {"choices", json::array()}, {"usage", usage_object(prompt_tokens, completion_tokens)}});
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      }
      const auto [prompt, out] = std::move(st->queue.front());
      st->queue.pop_front();
      lock.unlock();
      for (const engine::SampleOutput& sample : out.samples) {
        if (!send(completion_chunk(request, prompt, sample, info, options.model_name, id, created))) return false;
      }
      return true;
    };
    // Called when the response ends; not successfully: the client is gone, so are its requests.
    auto releaser = [this, st](bool success) {
      if (success) return;
      for (const engine::RequestId rid : st->ids) loop.abort(rid, "the client went away");
    };
    res.set_chunked_content_provider("text/event-stream", provider, releaser);
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const CompletionRequest request = parse_completion(parse_body(req), info, options.limits, options.model_name);
    if (request.stream) return stream_completions(request, res);
    const auto outputs = run_all(request.prompts, "prompt");
    std::vector<std::vector<CompletedSample>> samples;
    for (std::size_t p = 0; p < outputs.size(); ++p) {
      auto& mine = samples.emplace_back();
      for (int64_t i = 0; i < request.prompts[p].n; ++i) mine.push_back(gather_sample(outputs[p], i));
    }
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
    reply_json(res, 200, completion_response(request, samples, info, options.model_name,
                                             "cmpl-" + std::to_string(next_id++), created));
  }

  void install_routes() {
    const auto workers = static_cast<std::size_t>(std::max<int64_t>(1, options.worker_threads));
    http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
    http.set_payload_max_length(static_cast<std::size_t>(options.max_body_bytes));
    http.set_read_timeout(options.read_timeout_seconds, 0);
    http.set_write_timeout(options.write_timeout_seconds, 0);
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (const std::string too_big = headers_over_limits(req); !too_big.empty()) {
        reply_error(res, 431, too_big);
        return httplib::Server::HandlerResponse::Handled;
      }
      if (draining) {  // a new request on a kept-alive connection: not one in flight
        res.set_header("Connection", "close");
        reply_error(res, 503, "the server is shutting down");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (req.path == "/health" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
      reply_error(res, 401, "missing or wrong API key: send Authorization: Bearer <key>");
      return httplib::Server::HandlerResponse::Handled;
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) { reply_json(res, 200, {{"status", "ok"}}); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json model = {{"id", options.model_name}, {"object", "model"}, {"owned_by", "r3"},
                          {"max_model_len", info.max_position_embeddings}};
      reply_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(loop.stats(), loop.options().block_size), "text/plain; version=0.0.4");
    });
    http.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      try {
        std::rethrow_exception(ep);
      } catch (const ApiError& e) {
        reply_error(res, e.status(), e.what(), e.param());
      } catch (const std::exception& e) {
        spdlog::error("server: {}", e.what());
        reply_error(res, 500, e.what());
      }
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // an answer of ours
      const auto known = methods.find(req.path);
      if (res.status == 404 && known != methods.end()) {
        res.set_header("Allow", known->second);
        reply_error(res, 405, req.path + " takes " + known->second + ", not " + req.method);
      } else if (res.status == 404) reply_error(res, 404, "no endpoint " + req.method + " " + req.path);
      else if (res.status == 413) reply_error(res, 413, "the request body is larger than the server accepts");
      else reply_error(res, res.status, "the request could not be served");
    });
  }
};

HttpServer::HttpServer(EngineLoop& loop, const models::ModelInfo& info, ServerOptions options)
    : impl_(std::make_unique<Impl>(loop, info, std::move(options))) {
  impl_->install_routes();
}

HttpServer::~HttpServer() { stop(); }

namespace {

// The listening socket bound to `port` among this process's descriptors (-1 if none): cpp-httplib
// does not expose it, and two things below need it.
int listening_socket(int port) {
  for (int fd = 0; fd < 4096; ++fd) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    int bound_port = -1;
    if (address.ss_family == AF_INET) bound_port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
    else if (address.ss_family == AF_INET6) bound_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
    int listening = 0;
    socklen_t size = sizeof(listening);
    if (bound_port == port && getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening) return fd;
  }
  return -1;
}

// Debian's cpp-httplib is a compiled library whose listen backlog is its compile-time default, 5
// connections: a burst of clients (a rollout step's requests all at once) overflows it and some
// connections fail. listen() is called again with the system's maximum, which Linux applies to a
// listening socket.
void widen_listen_backlog(int port) {
  const int fd = listening_socket(port);
  if (fd < 0) {
    spdlog::warn("serve: the listening socket was not found; the listen backlog stays at 5 connections");
  } else if (::listen(fd, SOMAXCONN) != 0) {
    spdlog::warn("serve: could not widen the listen backlog: {}", std::strerror(errno));
  }
}

}  // namespace

int HttpServer::bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = impl_->http.bind_to_any_port(host);
    R3_CHECK(bound > 0, "serve: cannot listen on ", host, " (any port)");
  } else {
    R3_CHECK(impl_->http.bind_to_port(host, port), "serve: cannot listen on ", host, ":", port,
             " (in use, or not an address of this machine)");
  }
  widen_listen_backlog(bound);
  impl_->port = bound;
  return bound;
}

void HttpServer::serve() {
  impl_->http.listen_after_bind();  // returns once stopped and every worker is done
  std::lock_guard lock(impl_->serving_mutex);
  impl_->serving_ended = true;
  impl_->serving_ended_cv.notify_all();
}

bool HttpServer::running() const { return impl_->http.is_running(); }

void HttpServer::stop() {
  if (!impl_->draining && impl_->http.is_running()) impl_->http.stop();
}

// cpp-httplib's stop() also cuts every streamed answer short (its chunk writer stops once the
// server is stopping), so a graceful stop cannot use it. Shutting the listening socket down
// instead makes the accept loop end on its own; the workers then finish what they hold, and
// serve() returns when they are done.
void HttpServer::shutdown(std::chrono::milliseconds grace) {
  if (!impl_->draining.exchange(true)) {
    const int fd = listening_socket(impl_->port);
    if (fd >= 0) {
      ::shutdown(fd, SHUT_RDWR);
    } else {
      impl_->draining = false;
      stop();  // not found: the abrupt way
    }
  }
  std::unique_lock lock(impl_->serving_mutex);
  if (impl_->serving_ended_cv.wait_for(lock, grace, [this] { return impl_->serving_ended; })) return;
  lock.unlock();
  spdlog::warn("serve: requests still running after the shutdown grace of {} s; ending them",
               std::chrono::duration<double>(grace).count());
  impl_->loop.abort_every_request("the server is shutting down");
}

}  // namespace r3::server
