#include "server/json_fields.h"

#include "server/api_error.h"

namespace r3::server {

using nlohmann::json;

int64_t integer(const json& v, const std::string& name) {
  if (!v.is_number_integer()) throw ApiError(400, name + " must be an integer", name);
  return v.get<int64_t>();
}

double number(const json& v, const std::string& name) {
  if (!v.is_number()) throw ApiError(400, name + " must be a number", name);
  return v.get<double>();
}

std::vector<int32_t> token_ids(const json& v, const std::string& name, int64_t vocab) {
  if (!v.is_array()) throw ApiError(400, name + " must be a list of token ids", name);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& id : v) {
    if (!id.is_number_integer()) throw ApiError(400, name + " must hold integer token ids", name);
    const int64_t t = id.get<int64_t>();
    if (t < 0 || t >= vocab) {
      throw ApiError(400, name + ": token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")", name);
    }
    ids.push_back(static_cast<int32_t>(t));
  }
  return ids;
}

bool flag(const json& body, const char* name) {
  const auto found = body.find(name);
  if (found == body.end() || found->is_null()) return false;
  if (!found->is_boolean()) throw ApiError(400, std::string(name) + " must be true or false", name);
  return found->get<bool>();
}

}  // namespace r3::server
