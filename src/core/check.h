// Error type and the R3_CHECK macro used everywhere inside r3.
//
// Inside the engine a failed check throws r3::Error carrying the message and the source
// location. At the API boundary the message becomes a one-line error (the CLI's, with a
// non-zero exit; the HTTP server's error response); nothing inside r3 aborts the process on bad
// input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace r3 {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string location)
      : std::runtime_error(std::move(message)), location_(std::move(location)) {}
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}

  // "file:line" of the check that failed; empty when thrown directly.
  const std::string& location() const { return location_; }

 private:
  std::string location_;
};

namespace detail {

template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               std::string message);

}  // namespace detail
}  // namespace r3

// R3_CHECK(cond, "message parts", value, ...) throws r3::Error when cond is false.
#define R3_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ::r3::detail::check_failed(__FILE__, __LINE__, #cond,                     \
                                 ::r3::detail::concat(__VA_ARGS__));            \
    }                                                                           \
  } while (0)

// R3_FAIL("message parts", ...) throws unconditionally.
#define R3_FAIL(...) \
  ::r3::detail::check_failed(__FILE__, __LINE__, nullptr, ::r3::detail::concat(__VA_ARGS__))
