// Fixed-order float dot product shared by the CPU kernels.
//
// Sixteen independent partial sums let the compiler vectorise without -ffast-math; the order of
// additions depends only on the length, so every kernel built on it gives the same bits whatever
// the thread count or batch composition.
#pragma once

#include <cstdint>

namespace r3::ops {

inline float dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

}  // namespace r3::ops
