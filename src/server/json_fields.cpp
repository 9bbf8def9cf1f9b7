#include "server/json_fields.h"

#include <limits>

#include "server/api_error.h"

namespace r3::server {

using nlohmann::json;

int64_t integer(const json& v, const std::string& name) {
  if (!v.is_number_integer()) throw ApiError(400, name + " must be an integer", name);
  // Above 2^63 - 1 the value is held unsigned: said as it was sent, not wrapped negative.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw ApiError(400, name + " = " + std::to_string(v.get<uint64_t>()) + " is too large (at most " +
                            std::to_string(std::numeric_limits<int64_t>::max()) + ")", name);
  }
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

namespace {

bool number_equals(const json& v, double neutral) { return v.is_number() && v.get<double>() == neutral; }

}  // namespace

bool refuse_unless_neutral(const std::string& key, const json& value, const std::string& name) {
  struct Field {
    const char* key;
    bool (*neutral)(const json&);
    const char* neutral_value;  // what to send instead, for the message ("" when nothing is)
  };
  static const Field fields[] = {
      {"logit_bias", [](const json& v) { return v.is_object() && v.empty(); }, "{}"},
      {"presence_penalty", [](const json& v) { return number_equals(v, 0); }, "0"},
      {"frequency_penalty", [](const json& v) { return number_equals(v, 0); }, "0"},
      {"repetition_penalty", [](const json& v) { return number_equals(v, 1); }, "1"},
      {"best_of", [](const json& v) { return number_equals(v, 1); }, "1"},
      {"min_tokens", [](const json& v) { return number_equals(v, 0); }, "0"},
      {"min_new_tokens", [](const json& v) { return number_equals(v, 0); }, "0"},
      {"top_logprobs", [](const json& v) { return number_equals(v, 0); }, "0"},
      {"prompt_logprobs", [](const json&) { return false; }, ""},
      {"response_format",
       [](const json& v) { return v.is_object() && v.value("type", json()) == "text" && v.size() == 1; },
       "{\"type\": \"text\"}"},
      {"guided_json", [](const json&) { return false; }, ""},
      {"guided_regex", [](const json&) { return false; }, ""},
      {"guided_choice", [](const json&) { return false; }, ""},
      {"guided_grammar", [](const json&) { return false; }, ""},
      {"json_schema", [](const json&) { return false; }, ""},
      {"regex", [](const json&) { return false; }, ""},
      {"ebnf", [](const json&) { return false; }, ""},
  };
  for (const Field& f : fields) {
    if (key != f.key) continue;
    if (f.neutral(value)) return true;
    std::string message = name + " is not supported by r3 (it would change the result): leave it out";
    if (*f.neutral_value != '\0') message += std::string(" or send ") + f.neutral_value;
    throw ApiError(400, message, name);
  }
  return false;
}

bool flag(const json& body, const char* name) {
  const auto found = body.find(name);
  if (found == body.end() || found->is_null()) return false;
  if (!found->is_boolean()) throw ApiError(400, std::string(name) + " must be true or false", name);
  return found->get<bool>();
}

}  // namespace r3::server
