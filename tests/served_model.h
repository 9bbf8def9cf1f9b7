// The tiny Qwen3-MoE fixture behind r3's HTTP server on a free loopback port, and small client
// helpers, for the HTTP tests (test_http_server.cpp, test_http_robustness.cpp).
#pragma once

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "models/registry.h"
#include "server/engine_loop.h"
#include "server/http_server.h"

namespace r3::test {

// Little-endian int32 values from base64 (what the server returns routed experts as).
std::vector<int32_t> base64_int32(const std::string& text);

// A served tiny Qwen3-MoE on 127.0.0.1 at a free port, for the length of a test.
class Served {
 public:
  explicit Served(server::ServerOptions options = {}, engine::EngineOptions engine_options = {});
  ~Served();
  Served(const Served&) = delete;
  Served& operator=(const Served&) = delete;

  // Generous read timeout: the machine may be busy (the default is 5 s).
  httplib::Client client() const;
  int port() const { return port_; }
  models::CausalLM& model() { return *model_; }
  engine::EngineStats stats() const { return engine_->stats(); }
  backend::Context& ctx() { return ctx_; }
  server::HttpServer& server() { return *server_; }

 private:
  std::unique_ptr<models::CausalLM> model_;
  backend::Context ctx_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<server::EngineLoop> loop_;
  std::unique_ptr<server::HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

// POSTs `body` and expects `expected_status` and a JSON answer (returned; null when none came).
nlohmann::json post(httplib::Client& c, const std::string& path, const std::string& body, int expected_status,
                    const httplib::Headers& headers = {});

// A plain TCP connection to 127.0.0.1:port, for what an HTTP client library would not do:
// leaving mid-answer, malformed requests. Closed when destroyed.
class RawConnection {
 public:
  explicit RawConnection(int port);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  bool connected() const { return fd_ >= 0; }
  void send_all(const std::string& bytes);
  // Reads until `marker` has arrived (or the peer closes, or `seconds` pass); everything read so far.
  std::string read_until(const std::string& marker, double seconds = 60);
  // Reads until the peer closes the connection (or `seconds` pass).
  std::string read_to_end(double seconds = 120);
  void close();
  // Whether a read found the connection closed by the server.
  bool peer_closed() const { return peer_closed_; }

 private:
  int fd_ = -1;
  bool peer_closed_ = false;
  std::string received_;
};

// An HTTP/1.1 POST of a JSON body as raw bytes (Connection: close).
std::string raw_post(const std::string& path, const std::string& body);

// The JSON events of a server-sent-event stream ("data: {...}" lines; [DONE] left out).
std::vector<nlohmann::json> sse_events(const std::string& stream);

}  // namespace r3::test
