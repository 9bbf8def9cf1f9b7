#include "server/api_error.h"

namespace r3::server {

nlohmann::json error_body(int status, const std::string& message, const std::string& param) {
  const char* type = status == 400   ? "BadRequestError"
                     : status == 401 ? "AuthenticationError"
                     : status == 404 ? "NotFoundError"
                     : status == 405 ? "MethodNotAllowedError"
                     : status == 413 ? "RequestTooLargeError"
                     : status == 415 ? "UnsupportedMediaTypeError"
                     : status == 431 ? "RequestHeaderFieldsTooLargeError"
                     : status == 503 ? "ServiceUnavailableError"
                                     : "InternalServerError";
  nlohmann::json error = {{"message", message}, {"type", type}, {"code", status}};
  error["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  return {{"error", error}};
}

}  // namespace r3::server
