#include "io/hf_config.h"

#include <cmath>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/input_file.h"
#include "io/json_file.h"

namespace r3 {

using json = nlohmann::json;

HfConfig HfConfig::load(const std::string& model_dir) {
  const auto path = (std::filesystem::path(model_dir) / "config.json").string();
  std::error_code missing;
  R3_CHECK(std::filesystem::exists(path, missing), "cannot read ", path, ": is ", model_dir,
           " a Hugging Face model folder?");
  // Through the one file reader: a regular file of at most kMaxConfigBytes (a FIFO does not block).
  return parse(read_input_file(path, kMaxConfigBytes, "a config file"), path);
}

HfConfig HfConfig::parse(const std::string& text, const std::string& source) {
  HfConfig c;
  c.source_ = source;
  c.json_ = std::make_shared<json>(parse_json(text, source));  // depth-limited
  R3_CHECK(c.json_->is_object(), source, ": top level is not a JSON object");
  return c;
}

bool HfConfig::has(const std::string& key) const {
  return json_->contains(key) && !(*json_)[key].is_null();
}

const json& HfConfig::at(const std::string& key) const {
  R3_CHECK(has(key), source_, ": required field '", key, "' is missing");
  return (*json_)[key];
}

namespace {

// What a value is, for a message: its JSON type, never the value itself (it may be huge).
std::string kind_of(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return "an integer beyond int64";
  if (v.is_number_integer()) return "an integer";
  return std::string("a ") + v.type_name();
}

}  // namespace

int64_t HfConfig::get_int64(const std::string& key) const {
  const json& v = at(key);
  R3_CHECK(v.is_number_integer(), source_, ": '", key, "' must be an integer, found ", kind_of(v));
  // nlohmann keeps integers above int64 as uint64; get<int64_t>() would wrap them.
  R3_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), source_, ": '", key,
           "' = ", v.get<uint64_t>(), " is out of range (larger than int64)");
  return v.get<int64_t>();
}

void HfConfig::out_of_range(const std::string& key, int64_t value, int64_t min, uint64_t max) const {
  R3_FAIL(source_, ": '", key, "' = ", value, " is out of range [", min, ", ", max, "]");
}

int64_t HfConfig::get_int_in(const std::string& key, int64_t min, int64_t max) const {
  const int64_t v = get_int64(key);
  if (v < min || v > max) out_of_range(key, v, min, static_cast<uint64_t>(max));
  return v;
}

int64_t HfConfig::get_int_in(const std::string& key, int64_t min, int64_t max, int64_t fallback) const {
  return has(key) ? get_int_in(key, min, max) : fallback;
}

double HfConfig::get_double(const std::string& key) const {
  const json& v = at(key);
  R3_CHECK(v.is_number(), source_, ": '", key, "' must be a number, found ", kind_of(v));
  return v.get<double>();
}

double HfConfig::get_double(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}

double HfConfig::get_double_in(const std::string& key, double min, double max, double fallback) const {
  if (!has(key)) return fallback;
  const double v = get_double(key);
  R3_CHECK(std::isfinite(v) && v >= min && v <= max, source_, ": '", key, "' = ", v, " is out of range [", min, ", ",
           max, "]");
  return v;
}

bool HfConfig::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = at(key);
  R3_CHECK(v.is_boolean(), source_, ": '", key, "' must be true or false, found ", kind_of(v));
  return v.get<bool>();
}

std::string HfConfig::get_string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const json& v = at(key);
  R3_CHECK(v.is_string(), source_, ": '", key, "' must be a string, found ", kind_of(v));
  return v.get<std::string>();
}

std::vector<int64_t> HfConfig::get_int64_list(const std::string& key) const {
  const json& v = at(key);
  R3_CHECK(v.is_array(), source_, ": '", key, "' must be a list of integers, found ", kind_of(v));
  std::vector<int64_t> out;
  for (const json& x : v) {
    R3_CHECK(x.is_number_integer(), source_, ": '", key, "' must hold integers, found ", kind_of(x));
    R3_CHECK(!x.is_number_unsigned() || x.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), source_, ": '", key,
             "' holds ", x.get<uint64_t>(), ", out of range (larger than int64)");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

bool HfConfig::is_list(const std::string& key) const { return at(key).is_array(); }

std::vector<std::string> HfConfig::get_string_list(const std::string& key,
                                                   const std::vector<std::string>& fallback) const {
  if (!has(key)) return fallback;
  const json& v = at(key);
  R3_CHECK(v.is_array(), source_, ": '", key, "' must be a list of strings, found ", kind_of(v));
  std::vector<std::string> out;
  for (const json& x : v) {
    R3_CHECK(x.is_string(), source_, ": '", key, "' must hold strings, found ", kind_of(x));
    out.push_back(x.get<std::string>());
  }
  return out;
}

const std::string& HfConfig::first_present(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (has(k)) return k;
  }
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "'" : " or '") + k + "'";
  R3_FAIL(source_, ": required field ", names, " is missing");
}

std::optional<HfConfig> HfConfig::get_object(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const json& v = at(key);
  R3_CHECK(v.is_object(), source_, ": '", key, "' must be an object, found ", kind_of(v));
  HfConfig c;
  c.source_ = source_ + " (" + key + ")";
  c.json_ = std::make_shared<json>(v);
  return c;
}

std::string HfConfig::architecture() const {
  if (!has("architectures")) return "";
  const json& v = at("architectures");
  R3_CHECK(v.is_array(), source_, ": 'architectures' must be a list");
  if (v.empty()) return "";
  R3_CHECK(v[0].is_string(), source_, ": 'architectures' must hold strings");
  return v[0].get<std::string>();
}

}  // namespace r3
