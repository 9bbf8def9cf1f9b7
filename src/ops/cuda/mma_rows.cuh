// The inner loop of r3's bfloat16 tensor-core kernels for decode-sized steps (the routed experts,
// moe/cuda/sm90_experts_tensor_cores.cu; the dense projections, ops/cuda/sm90_linear_mma_rows.cu;
// both also over FP8 weights widened exactly to bfloat16, multiply_fp8):
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

#include "ops/cuda/split_value.cuh"
#include "ops/cuda/warp_row_dots.cuh"
#include "ops/cuda/weight_rows.cuh"

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
  const SplitValue parts = split_value(v);
  s.hi[row * s.width + col] = parts.hi;
  s.lo[row * s.width + col] = parts.lo;
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

// Where this lane's activation row of each of the kN 8-row tiles from row `first` starts (its
// first K position, 8t), high and low parts; null for rows from `end` on (they count as zeros).
template <int kN>
__device__ inline void lane_activation_rows(const SplitRows& a, int64_t first, int64_t end,
                                            const __nv_bfloat16* (&x_hi)[kN], const __nv_bfloat16* (&x_lo)[kN]) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int64_t p = first + n * kColsPerTile + g;
    x_hi[n] = p < end ? a.hi + p * a.width + 8 * t : nullptr;
    x_lo[n] = p < end ? a.lo + p * a.width + 8 * t : nullptr;
  }
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
  lane_activation_rows<kN>(a, first, end, x_hi, x_lo);
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

// A 16-row tile of FP8 e4m3 weights with 2D block scales: rows at `values` (a.width bytes
// apart), the scale row of the tile's block at `scales` (one per block_cols positions). The 16
// rows lie in one block (block_rows a multiple of 16), and each 32-position K step in one
// (block_cols a multiple of 32).
struct Fp8Tile {
  const uint8_t* values;
  const float* scales;
  int32_t block_cols;
};

// Eight e4m3 bytes (K positions in byte order) as eight bfloat16, exactly: every e4m3 value is a
// bfloat16 (3 mantissa bits of 7, exponents within range), laid out as one 128-bit load of bf16.
__device__ inline uint4 e4m3x8_to_bf16x8(uint2 v) {
  uint4 r;
  uint32_t* out = &r.x;
  const uint32_t words[2] = {v.x, v.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b = __float22bfloat162_rn(e4m3x2_to_float2(static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)))));
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return r;
}

// multiply() over FP8 tiles: each block of block_cols K positions multiplies the tiles' e4m3
// values (widened exactly to bfloat16) into partial sums, which the block's scale then scales
// into acc. The weights' part is the CPU's e4m3 value; only the scale's product is placed
// differently (after the block's sum instead of on each weight). K positions [k_begin, k_end)
// (k_end 0: the whole K), k_begin a multiple of block_cols. kInFlight K steps' loads are issued
// before the first of them is widened and multiplied, as multiply()'s kUnroll does for bfloat16
// (with 1, each step's 8-byte loads wait for the previous step's MMAs); the MMAs run in the same
// order either way, so the bits are the same.
template <int kB, int kN, int kInFlight = 1>
__device__ void multiply_fp8(const SplitRows& a, int64_t first, int64_t end, const Fp8Tile (&w)[kB],
                             float (&acc)[kB][kN][4], int64_t k_begin = 0, int64_t k_end = 0) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const __nv_bfloat16* x_hi[kN];
  const __nv_bfloat16* x_lo[kN];
  lane_activation_rows<kN>(a, first, end, x_hi, x_lo);
  const int64_t block = w[0].block_cols, k_stop = k_end > 0 ? k_end : a.width;
  for (int64_t kb = k_begin; kb < k_stop; kb += block) {
    const int64_t kb_end = kb + block < k_stop ? kb + block : k_stop;
    float part[kB][kN][4] = {};
    for (int64_t k0 = kb; k0 < kb_end; k0 += kStepK * kInFlight) {
      uint2 top[kInFlight][kB], bottom[kInFlight][kB];
      uint4 hi[kInFlight][kN], lo[kInFlight][kN];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t k = k0 + u * kStepK;
        if (k >= kb_end) break;
#pragma unroll
        for (int m = 0; m < kB; ++m) {
          top[u][m] = load_streaming8(w[m].values + g * a.width + k + 8 * t);
          bottom[u][m] = load_streaming8(w[m].values + (g + 8) * a.width + k + 8 * t);
        }
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          hi[u][n] = x_hi[n] ? *reinterpret_cast<const uint4*>(x_hi[n] + k) : make_uint4(0, 0, 0, 0);
          lo[u][n] = x_lo[n] ? *reinterpret_cast<const uint4*>(x_lo[n] + k) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (k0 + u * kStepK >= kb_end) break;
#pragma unroll
        for (int m = 0; m < kB; ++m) {
          const uint4 wt = e4m3x8_to_bf16x8(top[u][m]), wb = e4m3x8_to_bf16x8(bottom[u][m]);
#pragma unroll
          for (int n = 0; n < kN; ++n) {
            mma(part[m][n], wt.x, wb.x, wt.y, wb.y, hi[u][n].x, hi[u][n].y);
            mma(part[m][n], wt.x, wb.x, wt.y, wb.y, lo[u][n].x, lo[u][n].y);
            mma(part[m][n], wt.z, wb.z, wt.w, wb.w, hi[u][n].z, hi[u][n].w);
            mma(part[m][n], wt.z, wb.z, wt.w, wb.w, lo[u][n].z, lo[u][n].w);
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kB; ++m) {
      const float scale = w[m].scales[static_cast<uint32_t>(kb) / static_cast<uint32_t>(block)];
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] = __fadd_rn(acc[m][n][i], __fmul_rn(part[m][n][i], scale));
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
