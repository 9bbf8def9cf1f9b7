// A GPU kernel choice kept switchable so that it can be measured against what it replaced in the
// same binary (bench/gpu.sh R3_AB): on unless the environment variable `name` is "0". Read at each
// launch (a graph keeps the choice it was captured with), so tests may set it around a call.
#pragma once

#include <cstdlib>
#include <cstring>

namespace r3::backend::cuda {

inline bool diagnostic_switch_on(const char* name) {
  const char* setting = std::getenv(name);
  return setting == nullptr || std::strcmp(setting, "0") != 0;
}

// A choice the engine makes by a measured rule (`by_rule`), forced by the environment variable
// `name` for a measurement or a test: "0" never, any other value always.
inline bool diagnostic_choice(const char* name, bool by_rule) {
  const char* setting = std::getenv(name);
  return setting == nullptr ? by_rule : std::strcmp(setting, "0") != 0;
}

}  // namespace r3::backend::cuda
