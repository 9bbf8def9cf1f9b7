// `r3 serve`'s HTTP/1.1 layer, event-driven on Boost.Beast over Asio (Debian's libboost-dev:
// header-only, maintained with Boost, and the usual C++ choice for a server that must not give
// a thread to each connection). One event-loop thread holds every connection; an idle or slow
// one costs a socket and a few kilobytes, never a thread. Each request has one deadline for its
// headers and body together; header bytes, header fields and the body (chunked and compressed
// included, measured after decoding) are bounded while they are read. Bodies are parsed and
// answers formatted on a small pool of worker threads, so /health and /metrics are answered
// from the event loop whatever the load. The only queue is the engine's: a request beyond it is
// a 503 with Retry-After. The endpoints themselves: server/api_routes.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "models/model_info.h"
#include "server/api_routes.h"
#include "server/engine_loop.h"
#include "server/sglang_api.h"

namespace r3::server {

struct ServerOptions {
  std::string model_name;          // what /v1/models lists
  std::string api_key;             // empty: no authentication
  int64_t max_body_bytes = 64 << 20;  // after Content-Encoding is undone
  // A request's headers and body must arrive within this, from its first byte (or, on a kept-alive
  // connection, from the end of the answer before); else the connection is closed.
  int read_timeout_seconds = 30;
  // Each write of an answer (a stream's events included) must complete within this: a client
  // that stops reading is dropped and its requests end.
  int write_timeout_seconds = 30;
  // Threads that parse request bodies and format answers (0: half the machine's cores, at least 2).
  int64_t worker_threads = 0;
  // Request headers: more fields or more bytes in all is a 431.
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
  // Serves on the calling thread until the server has stopped (stop(), or shutdown()'s end).
  void serve();
  // Whether the server is accepting connections.
  bool running() const;
  // Stops at once: no new connections, every connection closed (their requests end, as when a
  // client goes away), serve() returns.
  void stop();
  // A graceful stop (SIGTERM): no new connections; connections between requests are closed; the
  // requests in flight have `grace` to finish; those still running then end with an abort (their
  // clients get what was generated, finish reason "abort"), and after at most 2 s more every
  // connection is closed and serve() returns. Returns when serve() has returned.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Raises this process's soft limit on open descriptors to its hard limit (every connection holds
// one), and returns the limit now in force.
int64_t raise_open_file_limit();

}  // namespace r3::server
