// config.json of a Hugging Face model, with typed getters whose errors name the file and key.
// Family files (src/models/families) turn it into their typed spec.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
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
  // Integers are range-checked into the caller's type T: a value outside it (or outside int64)
  // is an error naming the file and key, never a truncated number.
  template <typename T = int64_t>
  T get_int(const std::string& key) const {
    return narrow<T>(key, get_int64(key));
  }
  template <typename T = int64_t>
  T get_int(const std::string& key, std::type_identity_t<T> fallback) const {
    return has(key) ? get_int<T>(key) : fallback;
  }
  // An integer in [min, max]; the error names the file, key and range.
  int64_t get_int_in(const std::string& key, int64_t min, int64_t max) const;
  int64_t get_int_in(const std::string& key, int64_t min, int64_t max, int64_t fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  // A finite number in [min, max] (NaN and infinities refused), or `fallback` when absent.
  double get_double_in(const std::string& key, double min, double max, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  template <typename T = int64_t>
  std::vector<T> get_int_list(const std::string& key, const std::vector<T>& fallback) const {
    if (!has(key)) return fallback;
    std::vector<T> out;
    for (int64_t v : get_int64_list(key)) out.push_back(narrow<T>(key, v));
    return out;
  }
  // An integer or a list of integers (e.g. eos_token_id), as a list; empty when absent.
  template <typename T = int64_t>
  std::vector<T> get_int_or_list(const std::string& key) const {
    if (!has(key)) return {};
    if (is_list(key)) return get_int_list<T>(key, {});
    return {get_int<T>(key)};
  }
  // A list of strings (e.g. layer_types); `fallback` when absent.
  std::vector<std::string> get_string_list(const std::string& key, const std::vector<std::string>& fallback) const;
  // First key present among `keys` (configs rename fields across versions).
  template <typename T = int64_t>
  T get_int_any(const std::vector<std::string>& keys) const {
    return get_int<T>(first_present(keys));
  }
  // A nested object as its own config (e.g. "rope_parameters"); nullopt when absent.
  std::optional<HfConfig> get_object(const std::string& key) const;

  // architectures[0], or "" when absent.
  std::string architecture() const;
  std::string model_type() const { return get_string("model_type", ""); }

 private:
  const nlohmann::json& at(const std::string& key) const;
  int64_t get_int64(const std::string& key) const;
  std::vector<int64_t> get_int64_list(const std::string& key) const;
  bool is_list(const std::string& key) const;
  const std::string& first_present(const std::vector<std::string>& keys) const;
  [[noreturn]] void out_of_range(const std::string& key, int64_t value, int64_t min, uint64_t max) const;
  template <typename T>
  T narrow(const std::string& key, int64_t value) const {
    static_assert(std::is_integral_v<T> && sizeof(T) <= sizeof(int64_t));
    if (!std::in_range<T>(value)) {
      out_of_range(key, value, static_cast<int64_t>(std::numeric_limits<T>::min()),
                   static_cast<uint64_t>(std::numeric_limits<T>::max()));
    }
    return static_cast<T>(value);
  }

  std::string source_;
  std::shared_ptr<const nlohmann::json> json_;
};

}  // namespace r3
