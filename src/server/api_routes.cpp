#include "server/api_routes.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/check.h"
#include "io/json_file.h"
#include "server/api_error.h"
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

namespace {

// Each endpoint's method, for a 405 (with Allow) rather than a 404 on a known path.
const std::map<std::string, std::string>& endpoint_methods() {
  static const std::map<std::string, std::string> methods = {{"/health", "GET"},     {"/v1/models", "GET"},
                                                             {"/metrics", "GET"},    {"/generate", "POST"},
                                                             {"/v1/completions", "POST"}};
  return methods;
}

// The body through r3's JSON reader: nesting deeper than kMaxJsonDepth is refused while parsing.
json parse_body(const std::string& body) {
  try {
    return parse_json(body, "the request body");
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
}

}  // namespace

ApiRoutes::ApiRoutes(EngineLoop& loop, const models::ModelInfo& info, RouteOptions options)
    : loop_(loop), info_(info), options_(std::move(options)) {}

bool ApiRoutes::is_engine_endpoint(const std::string& method, const std::string& path) {
  return method == "POST" && (path == "/generate" || path == "/v1/completions");
}

std::optional<HttpAnswer> ApiRoutes::answer_at_once(const HttpRequest& request) const {
  if (request.path != "/health" && !options_.api_key.empty() &&
      !equal_in_constant_time(request.authorization, "Bearer " + options_.api_key)) {
    return error_answer(401, "missing or wrong API key: send Authorization: Bearer <key>");
  }
  const auto known = endpoint_methods().find(request.path);
  if (known == endpoint_methods().end()) return error_answer(404, "no endpoint " + request.method + " " + request.path);
  if (known->second != request.method) {
    HttpAnswer answer = error_answer(405, request.path + " takes " + known->second + ", not " + request.method);
    answer.headers.emplace_back("Allow", known->second);
    return answer;
  }
  if (request.path == "/health") return json_answer(200, {{"status", "ok"}});
  if (request.path == "/v1/models") {
    const json model = {{"id", options_.model_name}, {"object", "model"}, {"owned_by", "r3"},
                        {"max_model_len", info_.max_position_embeddings}};
    return json_answer(200, {{"object", "list"}, {"data", json::array({model})}});
  }
  if (request.path == "/metrics") {
    return HttpAnswer{200, "text/plain; version=0.0.4", metrics_.render(loop_.stats(), loop_.options().block_size), {}};
  }
  return std::nullopt;
}

std::shared_ptr<EngineCall> ApiRoutes::start(const HttpRequest& request, std::function<void()> wake) {
  R3_CHECK(is_engine_endpoint(request.method, request.path), "start: ", request.method, " ", request.path,
           " is not an engine endpoint");
  EngineCall::Format format;
  format.info = &info_;
  format.model_name = options_.model_name;
  format.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::shared_ptr<EngineCall> call;
  if (request.path == "/generate") {
    GenerateRequest parsed = parse_generate(parse_body(request.body), info_, options_.limits);
    format.number = next_number_.fetch_add(static_cast<int64_t>(parsed.prompts.size()));
    call = std::make_shared<EngineCall>(std::move(parsed), std::move(format), metrics_, std::move(wake));
  } else {
    CompletionRequest parsed = parse_completion(parse_body(request.body), info_, options_.limits, options_.model_name);
    format.number = next_number_.fetch_add(static_cast<int64_t>(parsed.prompts.size()));
    call = std::make_shared<EngineCall>(std::move(parsed), std::move(format), metrics_, std::move(wake));
  }
  call->submit(loop_);
  return call;
}

}  // namespace r3::server
