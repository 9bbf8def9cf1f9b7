// AVX-512 variants of the fixed-order vector kernels in ops/cpu/dot.h. Products and sums are
// separate instructions (no FMA), as in the portable definition, so the bits are the same.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/avx512_target.h"
#include "ops/cpu/dot.h"

namespace r3::ops {

R3_AVX512 float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {  // the tail goes to lanes 0..n-i-1; masked lanes add nothing
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    acc = _mm512_mask_add_ps(acc, mask, acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i)));
  }
  return reduce_lanes_pairwise(acc);
}

R3_AVX512 void add_scaled_avx512(float p, const float* v, float* out, int64_t n) {
  const __m512 pv = _mm512_set1_ps(p);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), _mm512_mul_ps(pv, _mm512_loadu_ps(v + i))));
  }
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 o = _mm512_maskz_loadu_ps(mask, out + i);
    _mm512_mask_storeu_ps(out + i, mask, _mm512_add_ps(o, _mm512_mul_ps(pv, _mm512_maskz_loadu_ps(mask, v + i))));
  }
}

R3_AVX512 void dot_rows_avx512(const float* q, const float* rows, int64_t stride, int64_t n, int64_t d, float scale,
                               float* scores) {
  for (int64_t i = 0; i < n; ++i) scores[i] = dot_avx512(q, rows + i * stride, d) * scale;
}

// Each 16-float chunk of `out` stays in a register while every row of the run adds into it.
R3_AVX512 void add_scaled_rows_avx512(const float* p, const float* rows, int64_t stride, int64_t n, int64_t d,
                                      float* out) {
  for (int64_t c = 0; c < d; c += 16) {
    const auto mask = static_cast<__mmask16>(d - c >= 16 ? 0xffffu : (1u << (d - c)) - 1u);
    __m512 acc = _mm512_maskz_loadu_ps(mask, out + c);
    for (int64_t i = 0; i < n; ++i) {
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(p[i]), _mm512_maskz_loadu_ps(mask, rows + i * stride + c)));
    }
    _mm512_mask_storeu_ps(out + c, mask, acc);
  }
}

}  // namespace r3::ops
