// config.json of a Hugging Face model, with typed getters whose errors name the file and key.
// Family files (src/models/families) turn it into their typed spec.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace r3 {

class HfConfig {
 public:
  static HfConfig load(const std::string& model_dir);  // reads model_dir/config.json
  static HfConfig parse(const std::string& text, const std::string& source = "config.json");

  const std::string& source() const { return source_; }
  const nlohmann::json& raw() const { return *json_; }

  // Present and not null.
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> get_int_list(const std::string& key,
                                    const std::vector<int64_t>& fallback) const;
  // An integer or a list of integers (e.g. eos_token_id), as a list; empty when absent.
  std::vector<int64_t> get_int_or_list(const std::string& key) const;
  // First key present among `keys` (configs rename fields across versions).
  int64_t get_int_any(const std::vector<std::string>& keys) const;
  // A nested object as its own config (e.g. "rope_parameters"); nullopt when absent.
  std::optional<HfConfig> get_object(const std::string& key) const;

  // architectures[0], or "" when absent.
  std::string architecture() const;
  std::string model_type() const { return get_string("model_type", ""); }

 private:
  const nlohmann::json& at(const std::string& key) const;

  std::string source_;
  std::shared_ptr<const nlohmann::json> json_;
};

}  // namespace r3
