// A request the server refuses before it reaches the engine: the HTTP status and the error body
// in vLLM's current shape, {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace r3::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "")
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

// The error body for `status` (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError,
// 413 RequestTooLargeError, 503 ServiceUnavailableError, otherwise InternalServerError).
nlohmann::json error_body(int status, const std::string& message, const std::string& param = "");

}  // namespace r3::server
