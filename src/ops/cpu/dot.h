// Fixed-order float vector kernels shared by the CPU kernels: the dot product and the scaled
// add of attention's value sum.
//
// dot: sixteen partial sums (lane j adds a[i] * b[i] for i = j, j + 16, ... in order, each
// product rounded before the add), then the lanes added pairwise (j + 8, j + 4, j + 2, j + 1).
// The order depends only on the length, so every kernel built on it gives the same bits whatever
// the thread count or batch composition. The *_portable functions are the definition; dot and
// add_scaled run an AVX-512 variant where the CPU has it, equal to them bit for bit (the tests
// check it), because attention spends most of its time here.
#pragma once

#include <cstdint>

#include "ops/cpu/cpu_features.h"

namespace r3::ops {

inline float dot_portable(const float* a, const float* b, int64_t n) {
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

// out[i] += p * v[i], the product rounded before the add.
inline void add_scaled_portable(float p, const float* v, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += p * v[i];
}

// Attention's two loops over a run of n rows, `stride` floats apart (d floats each):
//   dot_rows:        scores[i] = dot(q, rows + i * stride, d) * scale
//   add_scaled_rows: add_scaled(p[i], rows + i * stride, out, d) for i = 0, 1, ... in order
// The same arithmetic as row-by-row calls; one call per run saves a call per row and, for the
// sum, keeps `out` in registers across the rows.
inline void dot_rows_portable(const float* q, const float* rows, int64_t stride, int64_t n, int64_t d, float scale,
                              float* scores) {
  for (int64_t i = 0; i < n; ++i) scores[i] = dot_portable(q, rows + i * stride, d) * scale;
}
inline void add_scaled_rows_portable(const float* p, const float* rows, int64_t stride, int64_t n, int64_t d,
                                     float* out) {
  for (int64_t i = 0; i < n; ++i) add_scaled_portable(p[i], rows + i * stride, out, d);
}

float dot_avx512(const float* a, const float* b, int64_t n);
void add_scaled_avx512(float p, const float* v, float* out, int64_t n);
void dot_rows_avx512(const float* q, const float* rows, int64_t stride, int64_t n, int64_t d, float scale,
                     float* scores);
void add_scaled_rows_avx512(const float* p, const float* rows, int64_t stride, int64_t n, int64_t d, float* out);

inline float dot(const float* a, const float* b, int64_t n) {
  return cpu_has_avx512() ? dot_avx512(a, b, n) : dot_portable(a, b, n);
}

inline void add_scaled(float p, const float* v, float* out, int64_t n) {
  if (cpu_has_avx512()) return add_scaled_avx512(p, v, out, n);
  add_scaled_portable(p, v, out, n);
}

inline void dot_rows(const float* q, const float* rows, int64_t stride, int64_t n, int64_t d, float scale,
                     float* scores) {
  if (cpu_has_avx512()) return dot_rows_avx512(q, rows, stride, n, d, scale, scores);
  dot_rows_portable(q, rows, stride, n, d, scale, scores);
}

inline void add_scaled_rows(const float* p, const float* rows, int64_t stride, int64_t n, int64_t d, float* out) {
  if (cpu_has_avx512()) return add_scaled_rows_avx512(p, rows, stride, n, d, out);
  add_scaled_rows_portable(p, rows, stride, n, d, out);
}

}  // namespace r3::ops
