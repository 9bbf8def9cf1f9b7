// The inner loop of r3's weight-streaming kernels (the fused experts, the dense GEMV): one warp
// reads a weight row once and takes its dot products with several activation rows, keeping one
// partial sum per row in registers; lanes take every 32nd element (or every 32nd group of eight
// with 128-bit loads) and the caller adds the lanes' sums with shuffles. Weights are float32 or
// bfloat16 widened exactly; activations and sums are float32.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace r3::ops::cuda {

constexpr int kWarp = 32;

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// Eight consecutive values from 16- (bf16) or 32-byte (float) aligned memory, widened: one or two
// 128-bit loads where element loads would take eight.
__device__ inline void load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
__device__ inline void load8(const __nv_bfloat16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// The dot products of one weight row w[0, n) with the rows x[j][0, n), j < count, into this lane's
// partial sums acc[j]: element by element, or eight at a time with 128-bit loads (kVec8: n a
// multiple of 8 and the rows aligned to 8 elements).
template <bool kVec8, typename W, int kMax>
__device__ inline void row_dots(const W* w, const float* const (&x)[kMax], int count, int64_t n, int lane,
                                float (&acc)[kMax]) {
  if constexpr (kVec8) {
    for (int64_t c = static_cast<int64_t>(lane) * 8; c < n; c += kWarp * 8) {
      float wv[8];
      load8(w + c, wv);
#pragma unroll
      for (int j = 0; j < kMax; ++j) {
        if (j < count) {
          float xv[8];
          load8(x[j] + c, xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[j] += xv[i] * wv[i];
        }
      }
    }
  } else {
    for (int64_t c = lane; c < n; c += kWarp) {
      const float wv = load(w, c);
#pragma unroll
      for (int j = 0; j < kMax; ++j) {
        if (j < count) acc[j] += x[j][c] * wv;
      }
    }
  }
}

// The sum of v over the warp's lanes, in every lane.
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace r3::ops::cuda
