#include "io/hf_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace r3 {

using json = nlohmann::json;

HfConfig HfConfig::load(const std::string& model_dir) {
  const auto path = std::filesystem::path(model_dir) / "config.json";
  std::ifstream in(path);
  R3_CHECK(in.good(), "cannot read ", path.string(), ": is ", model_dir,
           " a Hugging Face model folder?");
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path.string());
}

HfConfig HfConfig::parse(const std::string& text, const std::string& source) {
  HfConfig c;
  c.source_ = source;
  try {
    c.json_ = std::make_shared<json>(json::parse(text));
  } catch (const json::exception& e) {
    R3_FAIL(source, ": malformed JSON: ", e.what());
  }
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

int64_t HfConfig::get_int(const std::string& key) const {
  const json& v = at(key);
  R3_CHECK(v.is_number_integer(), source_, ": '", key, "' must be an integer, found ", v.dump());
  return v.get<int64_t>();
}

int64_t HfConfig::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double HfConfig::get_double(const std::string& key) const {
  const json& v = at(key);
  R3_CHECK(v.is_number(), source_, ": '", key, "' must be a number, found ", v.dump());
  return v.get<double>();
}

double HfConfig::get_double(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}

bool HfConfig::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = at(key);
  R3_CHECK(v.is_boolean(), source_, ": '", key, "' must be true or false, found ", v.dump());
  return v.get<bool>();
}

std::string HfConfig::get_string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const json& v = at(key);
  R3_CHECK(v.is_string(), source_, ": '", key, "' must be a string, found ", v.dump());
  return v.get<std::string>();
}

std::vector<int64_t> HfConfig::get_int_list(const std::string& key,
                                            const std::vector<int64_t>& fallback) const {
  if (!has(key)) return fallback;
  const json& v = at(key);
  R3_CHECK(v.is_array(), source_, ": '", key, "' must be a list of integers, found ", v.dump());
  std::vector<int64_t> out;
  for (const json& x : v) {
    R3_CHECK(x.is_number_integer(), source_, ": '", key, "' must hold integers, found ", x.dump());
    out.push_back(x.get<int64_t>());
  }
  return out;
}

std::vector<int64_t> HfConfig::get_int_or_list(const std::string& key) const {
  if (!has(key)) return {};
  if (at(key).is_array()) return get_int_list(key, {});
  return {get_int(key)};
}

int64_t HfConfig::get_int_any(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (has(k)) return get_int(k);
  }
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "'" : " or '") + k + "'";
  R3_FAIL(source_, ": required field ", names, " is missing");
}

std::optional<HfConfig> HfConfig::get_object(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const json& v = at(key);
  R3_CHECK(v.is_object(), source_, ": '", key, "' must be an object, found ", v.dump());
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
