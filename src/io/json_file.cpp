#include "io/json_file.h"

#include <set>
#include <vector>

#include "core/check.h"

namespace r3 {

using json = nlohmann::json;

json parse_json(std::string_view text, const std::string& source, JsonOptions options) {
  std::vector<std::set<std::string>> keys;  // per open object, when unique_keys
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // depth counts the containers already open around this one.
        R3_CHECK(depth < kMaxJsonDepth, source, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
        if (options.unique_keys && event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (options.unique_keys && !keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (options.unique_keys && !keys.empty()) {
          const auto& key = parsed.get_ref<const std::string&>();
          R3_CHECK(keys.back().insert(key).second, source, ": duplicate key '", brief(key), "'");
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    R3_FAIL(source, ": malformed JSON: ", e.what());
  }
}

json read_json_file(const std::string& path, uint64_t max_bytes, const char* what, JsonOptions options) {
  return parse_json(read_input_file(path, max_bytes, what), path, options);
}

std::string describe_json(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case json::value_t::string:
      return "a string \"" + brief(value.get_ref<const std::string&>(), 40) + "\"";
    case json::value_t::array:
      return detail::concat("a list of ", value.size(), value.size() == 1 ? " element" : " elements");
    case json::value_t::object:
      return detail::concat("an object of ", value.size(), value.size() == 1 ? " key" : " keys");
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number " + value.dump();  // a scalar: short
    default:
      return "a binary value";
  }
}

}  // namespace r3
