#include "core/check.h"

#include <cstring>

namespace r3::detail {

void check_failed(const char* file, int line, const char* condition, std::string message) {
  const char* slash = std::strrchr(file, '/');
  std::string location = concat(slash ? slash + 1 : file, ":", line);
  if (message.empty() && condition != nullptr) {
    message = concat("internal check failed: ", condition);
  }
  // An error is one line: a name or value quoted from input cannot break it.
  for (std::size_t i = 0; i < message.size(); ++i) {
    const auto c = static_cast<unsigned char>(message[i]);
    if (c == '\n') {
      message.replace(i, 1, "\\n");
      ++i;
    } else if (c == '\r' || c == '\t' || c == '\v' || c == '\f') {
      message[i] = ' ';
    }
  }
  throw Error(std::move(message), std::move(location));
}

}  // namespace r3::detail
