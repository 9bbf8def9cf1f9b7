// A request and an answer as the endpoints see them: the HTTP layer (server/http_server.cpp)
// has read, bounded and decoded the request, and writes the answer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace r3::server {

struct HttpRequest {
  std::string method;
  std::string path;           // the target without its query
  std::string authorization;  // the Authorization header, or empty
  std::string body;
  std::string content_encoding;  // of the body as it came (server/body_encoding.h undoes it)
};

struct HttpAnswer {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type and Content-Length
};

// A JSON answer (invalid UTF-8 quoted from a client replaced, not thrown on).
HttpAnswer json_answer(int status, const nlohmann::json& body);
// An error in vLLM's shape (server/api_error.h).
HttpAnswer error_answer(int status, const std::string& message, const std::string& param = "");
// JSON text with invalid UTF-8 replaced.
std::string json_text(const nlohmann::json& body);

}  // namespace r3::server
