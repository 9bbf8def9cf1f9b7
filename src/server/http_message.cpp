#include "server/http_message.h"

#include "server/api_error.h"

namespace r3::server {

std::string json_text(const nlohmann::json& body) {
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpAnswer json_answer(int status, const nlohmann::json& body) { return {status, "application/json", json_text(body), {}}; }

HttpAnswer error_answer(int status, const std::string& message, const std::string& param) {
  return json_answer(status, error_body(status, message, param));
}

}  // namespace r3::server
