#include "core/check.h"

#include <cstring>

namespace r3::detail {

void check_failed(const char* file, int line, const char* condition, std::string message) {
  const char* slash = std::strrchr(file, '/');
  std::string location = concat(slash ? slash + 1 : file, ":", line);
  if (message.empty() && condition != nullptr) {
    message = concat("internal check failed: ", condition);
  }
  throw Error(std::move(message), std::move(location));
}

}  // namespace r3::detail
