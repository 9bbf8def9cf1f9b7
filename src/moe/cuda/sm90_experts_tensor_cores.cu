// The routed experts on bfloat16 tensor cores (mma.sync m16n8k16, float32 accumulators), for
// steps whose experts have several pairs each. The pairs' float32 activations are first gathered
// in expert order and split into high and low bfloat16 parts (x = hi + lo to about 16
// significant bits, as ops/cuda/split_bf16.h does for the dense projections); both parts multiply
// the same weight fragment into one accumulator.
//
// The weights take the MMA's 16-row side and the pairs its 8-column side ("swapped" operands): a
// decode step's experts have a handful of pairs each, so 8 columns waste less of each MMA than
// 16 rows of pairs would, and the weights, the bytes that matter, fill whole fragments. One warp
// per (used expert, 16 weight rows) walks the whole K dimension with no shared memory and no
// block barrier. Since a dot product does not care in which order its K terms meet, each lane
// loads 8 consecutive weights of its row (one 128-bit load) and the same 8 positions of its
// pair's activations, and the two MMAs of those 32 K positions take them in the fragment slots
// that pair up the same positions: whole 128-bit loads, no shuffles. Gate and up share the
// activation fragments; the activation is applied on the accumulators and written, split again,
// in expert order for down, whose results go back to each pair's row for the combine.
#include <cuda_bf16.h>

#include "backend/cuda/launch.cuh"
#include "moe/cuda/experts_parts.cuh"
#include "ops/cuda/warp_row_dots.cuh"

namespace r3::moe::experts_detail {

namespace {

using ops::cuda::load_streaming;

constexpr int kRowsPerWarp = 16;  // the MMA's M: weight rows
constexpr int kPairsPerTile = 8;  // the MMA's N: pairs
constexpr int kStepK = 32;        // K positions per 128-bit load of each lane (two MMAs of 16)
constexpr int kWarps = 4;         // per block, one 16-row weight tile each
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

// The high and low parts of rows in expert order: hi [rows, width], then lo [rows, width].
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

// Row r of the gathered copy = hidden row of the pair order[r]'s token.
__global__ void gather_split(const float* __restrict__ hidden, int64_t k, Grouping g, int64_t pairs, SplitRows out) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pairs * out.width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.width, c = i % out.width;
    store_split(out, r, c, hidden[(g.order[r] / k) * out.width + c]);
  }
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

// acc[m][n] += W_m (16 rows at w[m], stride `width`) x the pairs [first + 8n, first + 8n + 8)
// of `a` (rows past `end` count as zeros), over the whole K = a.width. In the fragments, lane
// (g = lane / 4, t = lane % 4) holds rows g and g + 8 and pair column g, and K slots 2t, 2t + 1,
// 2t + 8, 2t + 9 of each MMA; here those slots carry K positions 8t + 4s + {0, 1, 2, 3} of the
// 32-position step for its MMA s, the same for weights and activations.
template <int kB, int kN, int kUnroll>
__device__ void multiply(const SplitRows& a, int32_t first, int32_t end, const __nv_bfloat16* const (&w)[kB],
                         float (&acc)[kB][kN][4]) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t width = a.width;
  const __nv_bfloat16* x_hi[kN];
  const __nv_bfloat16* x_lo[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int32_t p = first + n * kPairsPerTile + g;
    x_hi[n] = p < end ? a.hi + p * width + 8 * t : nullptr;
    x_lo[n] = p < end ? a.lo + p * width + 8 * t : nullptr;
  }
  for (int64_t k0 = 0; k0 < width; k0 += kStepK * kUnroll) {
    uint4 top[kUnroll][kB], bottom[kUnroll][kB], hi[kUnroll][kN], lo[kUnroll][kN];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStepK;
      if (k >= width) break;
#pragma unroll
      for (int m = 0; m < kB; ++m) {
        top[u][m] = load_streaming(w[m] + g * width + k + 8 * t);
        bottom[u][m] = load_streaming(w[m] + (g + 8) * width + k + 8 * t);
      }
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        hi[u][n] = x_hi[n] ? *reinterpret_cast<const uint4*>(x_hi[n] + k) : make_uint4(0, 0, 0, 0);
        lo[u][n] = x_lo[n] ? *reinterpret_cast<const uint4*>(x_lo[n] + k) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 + u * kStepK >= width) break;
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

// The warp's place: its used-expert slot and first weight row, or false when it has none.
__device__ inline bool warp_tile(const Grouping& g, int64_t rows, int64_t* slot, int64_t* n0) {
  const int64_t tiles = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  *slot = blockIdx.x / tiles;
  *n0 = (blockIdx.x % tiles) * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  return *slot < *g.used_count && *n0 < rows;
}

// Fewer loads in flight per lane when each carries more pairs (registers).
__host__ __device__ constexpr int unroll_for(int n) { return n == 1 ? 4 : 2; }

// What accumulator element i of a lane covers: weight row (n0 +) g or g + 8, pair column 2t or 2t + 1.
__device__ inline int acc_row(int lane, int i) { return lane / 4 + (i >= 2 ? 8 : 0); }
__device__ inline int acc_pair(int lane, int i) { return 2 * (lane % 4) + (i & 1); }

template <int kN>
__global__ void __launch_bounds__(kWarps * 32) gate_up_tiles(SplitRows x, Grouping g,
                                                              const __nv_bfloat16* __restrict__ gate,
                                                              const __nv_bfloat16* __restrict__ up,
                                                              const float* __restrict__ gate_bias,
                                                              const float* __restrict__ up_bias, int64_t inter,
                                                              Activation act, SplitRows activated) {
  backend::cuda::wait_for_predecessor();
  int64_t slot, n0;
  if (!warp_tile(g, inter, &slot, &n0)) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot], end = g.offsets[e + 1];
  const __nv_bfloat16* const w[2] = {gate + (e * inter + n0) * x.width, up + (e * inter + n0) * x.width};
  for (int32_t first = g.offsets[e]; first < end; first += kPairsPerTile * kN) {
    float acc[2][kN][4] = {};
    multiply<2, kN, unroll_for(kN)>(x, first, end, w, acc);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int32_t row = first + n * kPairsPerTile + acc_pair(lane, i);
        if (row >= end) continue;
        const int64_t col = n0 + acc_row(lane, i);
        float gs = acc[0][n][i], us = acc[1][n][i];
        if (gate_bias) gs += gate_bias[e * inter + col];
        if (up_bias) us += up_bias[e * inter + col];
        store_split(activated, row, col, act(gs, us));
      }
    }
  }
}

template <int kN>
__global__ void __launch_bounds__(kWarps * 32) down_tiles(SplitRows activated, Grouping g,
                                                           const __nv_bfloat16* __restrict__ down,
                                                           const float* __restrict__ down_bias, int64_t h,
                                                           float* __restrict__ expert_out) {
  backend::cuda::wait_for_predecessor();
  int64_t slot, n0;
  if (!warp_tile(g, h, &slot, &n0)) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot], end = g.offsets[e + 1];
  const __nv_bfloat16* const w[1] = {down + (e * h + n0) * activated.width};
  for (int32_t first = g.offsets[e]; first < end; first += kPairsPerTile * kN) {
    float acc[1][kN][4] = {};
    multiply<1, kN, unroll_for(kN)>(activated, first, end, w, acc);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int32_t row = first + n * kPairsPerTile + acc_pair(lane, i);
        if (row >= end) continue;
        const int64_t col = n0 + acc_row(lane, i);
        const float y = acc[0][n][i];
        expert_out[static_cast<int64_t>(g.order[row]) * h + col] = down_bias ? y + down_bias[e * h + col] : y;
      }
    }
  }
}

template <int kN>
void launch_tiles(cudaStream_t stream, const Grouping& g, const DeviceExperts& x, const Activation& act, int64_t slots,
                  const SplitRows& xs, const SplitRows& as, float* expert_out) {
  const int64_t inter = x.gate.dim(1), h = x.gate.dim(2);
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  const auto blocks = [&](int64_t n) { return static_cast<unsigned>(slots * ((n + kRowsPerBlock - 1) / kRowsPerBlock)); };
  backend::cuda::launch_kernel(gate_up_tiles<kN>, blocks(inter), kWarps * 32, 0, stream, xs, g,
                               static_cast<const __nv_bfloat16*>(x.gate.raw_data()),
                               static_cast<const __nv_bfloat16*>(x.up.raw_data()), bias(x.gate_bias), bias(x.up_bias),
                               inter, act, as);
  backend::cuda::launch_kernel(down_tiles<kN>, blocks(h), kWarps * 32, 0, stream, as, g,
                               static_cast<const __nv_bfloat16*>(x.down.raw_data()), bias(x.down_bias), h, expert_out);
}

}  // namespace

// Whole 16-row tiles and whole 32-position K steps: both widths multiples of 32 (so every
// 128-bit load is aligned in the 256-byte aligned buffers).
bool tensor_cores_fit(const DeviceExperts& x) {
  return x.gate.dtype() == DType::BF16 && x.gate.dim(1) % kStepK == 0 && x.gate.dim(2) % kStepK == 0;
}

void experts_on_tensor_cores(cudaStream_t stream, const float* hidden, int64_t k, const Grouping& g,
                             const DeviceExperts& x, const Activation& act, int64_t pairs, int64_t slots,
                             int64_t likely_pairs, float* activated, float* expert_out) {
  const int64_t inter = x.gate.dim(1), h = x.gate.dim(2), rows = expert_scratch_rows(pairs);
  // The gathered activations live in expert_out's scratch until down overwrites it; the
  // activated rows in activated's. Each holds rows x width floats: the two bfloat16 parts.
  auto* gathered = reinterpret_cast<__nv_bfloat16*>(expert_out);
  auto* act_parts = reinterpret_cast<__nv_bfloat16*>(activated);
  const SplitRows xs{gathered, gathered + rows * h, h}, as{act_parts, act_parts + rows * inter, inter};
  backend::cuda::launch_kernel(gather_split, static_cast<unsigned>(std::min<int64_t>((pairs * h + 255) / 256, 65535)),
                               256, 0, stream, hidden, k, g, pairs, xs);
  // Pair columns per pass for the pairs an expert is likely to have; an expert with more takes
  // another pass over its rows, which are then in L2.
  if (likely_pairs <= kPairsPerTile) launch_tiles<1>(stream, g, x, act, slots, xs, as, expert_out);
  else if (likely_pairs <= 2 * kPairsPerTile) launch_tiles<2>(stream, g, x, act, slots, xs, as, expert_out);
  else launch_tiles<4>(stream, g, x, act, slots, xs, as, expert_out);
}

}  // namespace r3::moe::experts_detail
