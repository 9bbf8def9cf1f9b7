// The inner loop of r3's bfloat16 tensor-core kernels for decode-sized steps (the routed experts,
// moe/cuda/sm90_experts_tensor_cores.cu; the dense projections, ops/cuda/sm90_linear_mma_rows.cu):
// mma.sync m16n8k16 with the weights as the 16-row side and up to 32 activation rows as 8-column
// tiles ("swapped" operands: a decode step has a handful of rows per weight matrix, so 8 columns
// waste less of each MMA than 16 rows would, and the weights, the bytes that matter, fill whole
// fragments). The float32 activations come split into high and low bfloat16 parts (x = hi + lo to
// about 16 significant bits, ops/cuda/split_bf16.h); both multiply the same weight fragment into
// one float32 accumulator.
//
// Since a dot product does not care in which order its K terms meet, each lane loads 8
// consecutive weights of its row (one 128-bit load) and the same 8 positions of its activation
// row, and the two MMAs of those 32 K positions take them in the fragment slots that pair up the
// same positions: whole 128-bit loads, no shared memory, no shuffles. Internal to the CUDA code.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/warp_row_dots.cuh"

namespace r3::ops::cuda::mma_rows {

constexpr int kRowsPerWarp = 16;  // the MMA's M: weight rows
constexpr int kColsPerTile = 8;   // the MMA's N: activation rows
constexpr int kStepK = 32;        // K positions per 128-bit load of each lane (two MMAs of 16)

// The high and low parts of activation rows: hi [rows, width], then lo [rows, width].
struct SplitRows {
  __nv_bfloat16* hi;
  __nv_bfloat16* lo;
  int64_t width;
};

__device__ inline void store_split(const SplitRows& s, int64_t row, int64_t col, float v) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  s.hi[row * s.width + col] = hi;
  s.lo[row * s.width + col] = __float2bfloat16_rn(v - __bfloat162float(hi));
}

// c (16 x 8, float32) += a (16 x 16, bfloat16, row-major fragment) x b (16 x 8, col-major).
__device__ inline void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc[m][n] += W_m (16 rows at w[m], stride a.width) x the activation rows [first + 8n, first +
// 8n + 8) of `a` (rows from `end` on count as zeros), over K positions [k_begin, k_end) (k_end 0:
// the whole K = a.width; both multiples of 32). In the fragments, lane (g = lane / 4, t = lane %
// 4) holds weight rows g and g + 8 and activation row g, and K slots 2t, 2t + 1, 2t + 8, 2t + 9 of
// each MMA; here those slots carry K positions 8t + 4s + {0, 1, 2, 3} of the 32-position step for
// its MMA s, the same for weights and activations.
template <int kB, int kN, int kUnroll>
__device__ void multiply(const SplitRows& a, int64_t first, int64_t end, const __nv_bfloat16* const (&w)[kB],
                         float (&acc)[kB][kN][4], int64_t k_begin = 0, int64_t k_end = 0) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t k_stop = k_end > 0 ? k_end : a.width;
  const __nv_bfloat16* x_hi[kN];
  const __nv_bfloat16* x_lo[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int64_t p = first + n * kColsPerTile + g;
    x_hi[n] = p < end ? a.hi + p * a.width + 8 * t : nullptr;
    x_lo[n] = p < end ? a.lo + p * a.width + 8 * t : nullptr;
  }
  for (int64_t k0 = k_begin; k0 < k_stop; k0 += kStepK * kUnroll) {
    uint4 top[kUnroll][kB], bottom[kUnroll][kB], hi[kUnroll][kN], lo[kUnroll][kN];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStepK;
      if (k >= k_stop) break;
#pragma unroll
      for (int m = 0; m < kB; ++m) {
        top[u][m] = load_streaming(w[m] + g * a.width + k + 8 * t);
        bottom[u][m] = load_streaming(w[m] + (g + 8) * a.width + k + 8 * t);
      }
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        hi[u][n] = x_hi[n] ? *reinterpret_cast<const uint4*>(x_hi[n] + k) : make_uint4(0, 0, 0, 0);
        lo[u][n] = x_lo[n] ? *reinterpret_cast<const uint4*>(x_lo[n] + k) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 + u * kStepK >= k_stop) break;
#pragma unroll
      for (int m = 0; m < kB; ++m) {
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          mma(acc[m][n], top[u][m].x, bottom[u][m].x, top[u][m].y, bottom[u][m].y, hi[u][n].x, hi[u][n].y);
          mma(acc[m][n], top[u][m].x, bottom[u][m].x, top[u][m].y, bottom[u][m].y, lo[u][n].x, lo[u][n].y);
          mma(acc[m][n], top[u][m].z, bottom[u][m].z, top[u][m].w, bottom[u][m].w, hi[u][n].z, hi[u][n].w);
          mma(acc[m][n], top[u][m].z, bottom[u][m].z, top[u][m].w, bottom[u][m].w, lo[u][n].z, lo[u][n].w);
        }
      }
    }
  }
}

// K steps a lane has in flight: fewer when each carries more activation tiles (registers).
__host__ __device__ constexpr int unroll_for(int n) { return n == 1 ? 4 : 2; }

// What accumulator element i of a lane covers: weight row (n0 +) g or g + 8, activation row 2t or 2t + 1.
__device__ inline int acc_row(int lane, int i) { return lane / 4 + (i >= 2 ? 8 : 0); }
__device__ inline int acc_col(int lane, int i) { return 2 * (lane % 4) + (i & 1); }

}  // namespace r3::ops::cuda::mma_rows
