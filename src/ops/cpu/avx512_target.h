// Shared by the AVX-512 kernel files (compiled for the baseline ISA, entered only after
// cpu_has_avx512()): the target attribute and the fixed pairwise lane reduction.
// Include after <immintrin.h>.
#pragma once

#define R3_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace r3::ops {

// Lanes added pairwise (l + 8, l + 4, l + 2, l + 1), as the portable definitions do.
R3_AVX512 inline float reduce_lanes_pairwise(__m512 acc) {
  const __m256 lo = _mm512_castps512_ps256(acc);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

}  // namespace r3::ops
