// r3's endpoints, whatever carries them: GET /health, GET /v1/models, GET /metrics (Prometheus),
// POST /generate (SGLang's format) and POST /v1/completions (vLLM's, token ids). With an API key,
// every endpoint but /health needs `Authorization: Bearer KEY` (compared in constant time).
//
// The cheap answers (health, models, metrics, and every refusal that needs no body: 401, 404,
// 405) come from answer_at_once, which an event loop may call whatever the load; the engine
// endpoints parse their body and submit in start(), which belongs off the event loop, and
// answer through the EngineCall it returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "models/model_info.h"
#include "server/engine_call.h"
#include "server/engine_loop.h"
#include "server/http_message.h"
#include "server/metrics.h"
#include "server/sglang_api.h"

namespace r3::server {

struct RouteOptions {
  std::string model_name;  // what /v1/models lists
  std::string api_key;     // empty: no authentication
  ApiLimits limits;
};

class ApiRoutes {
 public:
  ApiRoutes(EngineLoop& loop, const models::ModelInfo& info, RouteOptions options);

  // The answer when it needs neither the body nor the engine; nullopt for an engine endpoint
  // (then start()).
  std::optional<HttpAnswer> answer_at_once(const HttpRequest& request) const;
  // Whether `method path` is an engine endpoint that answer_at_once left to start().
  static bool is_engine_endpoint(const std::string& method, const std::string& path);
  // An engine endpoint's request: the body parsed and checked, the prompts submitted. Throws
  // ApiError for a body the endpoint refuses. wake: as EngineCall's.
  std::shared_ptr<EngineCall> start(const HttpRequest& request, std::function<void()> wake);

 private:
  EngineLoop& loop_;
  models::ModelInfo info_;
  RouteOptions options_;
  mutable ServerMetrics metrics_;
  std::atomic<int64_t> next_number_{0};
};

// Equal strings, in time that depends only on their lengths (API keys).
bool equal_in_constant_time(const std::string& a, const std::string& b);

}  // namespace r3::server
