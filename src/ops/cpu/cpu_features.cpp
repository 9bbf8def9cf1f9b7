#include "ops/cpu/cpu_features.h"

namespace r3::ops {

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

}  // namespace r3::ops
