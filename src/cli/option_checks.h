// Range checks for numeric options whose messages say what the option needs, e.g.
// "--max-new-tokens: must be an integer >= 1, got 0". CLI11's PositiveNumber / Range print
// "Value 0 not in range 0.000000 to 1797693134862315708145274237317043567980705675..." instead.
#pragma once

#include <charconv>
#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>

namespace r3::cli {

namespace option_checks_detail {

// The value as typed, cut short: it goes into a one-line error.
inline std::string shown(const std::string& input) {
  return input.size() <= 24 ? input : input.substr(0, 24) + "...";
}

// Strict parse: the whole input, no overflow (CLI11's own conversion saturates huge integers).
template <typename T>
bool parse(const std::string& input, T& value) {
  const auto [end, ec] = std::from_chars(input.data(), input.data() + input.size(), value);
  if constexpr (std::is_floating_point_v<T>) {
    if (ec == std::errc() && !std::isfinite(value)) return false;
  }
  return ec == std::errc() && end == input.data() + input.size();
}

template <typename T>
std::string format(T v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// `need` is what the option needs ("an integer >= 1"); `ok` tells whether a parsed value has it.
template <typename T, typename Ok>
CLI::Validator check(const std::string& need, const std::string& description, Ok ok) {
  return CLI::Validator(
      [need, ok](std::string& input) -> std::string {
        T value{};
        if (!parse(input, value)) return "must be " + need + ", got '" + shown(input) + "'";
        return ok(value) ? "" : "must be " + need + ", got " + shown(input);
      },
      description);
}

template <typename T>
std::string kind() {
  return std::is_integral_v<T> ? "an integer" : "a number";
}

}  // namespace option_checks_detail

// A T (integer or floating point, as the option's variable) >= min. Help shows it the way
// CLI11 shows its own checks ("INT:POSITIVE").
template <typename T>
CLI::Validator at_least(T min) {
  namespace d = option_checks_detail;
  const std::string description = min == T{0}                             ? "NONNEGATIVE"
                                  : min == T{1} && std::is_integral_v<T> ? "POSITIVE"
                                                                          : ">=" + d::format(min);
  return d::check<T>(d::kind<T>() + " >= " + d::format(min), description, [min](T v) { return v >= min; });
}

// A number in (lo, hi].
inline CLI::Validator in_open_closed(double lo, double hi) {
  namespace d = option_checks_detail;
  const std::string range = "(" + d::format(lo) + ", " + d::format(hi) + "]";
  return d::check<double>("a number in " + range, "(" + d::format(lo) + "," + d::format(hi) + "]",
                          [lo, hi](double v) { return v > lo && v <= hi; });
}

// A number in [lo, hi].
inline CLI::Validator in_closed(double lo, double hi) {
  namespace d = option_checks_detail;
  const std::string range = "[" + d::format(lo) + ", " + d::format(hi) + "]";
  return d::check<double>("a number in " + range, "[" + d::format(lo) + "," + d::format(hi) + "]",
                          [lo, hi](double v) { return v >= lo && v <= hi; });
}

}  // namespace r3::cli
