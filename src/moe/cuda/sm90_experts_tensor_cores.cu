// The routed experts on bfloat16 tensor cores (WMMA 16x16x16, float32 accumulators), for steps
// whose experts have several pairs each. The pairs' float32 activations are first gathered in
// expert order and split into high and low bfloat16 parts (x = hi + lo to about 16 significant
// bits, as ops/cuda/split_bf16.h does for the dense projections); both parts multiply the same
// weight fragment into one accumulator. Then one warp per (used expert, 16 weight rows) walks the
// whole K dimension with no shared memory and no block barrier, its A fragments (the expert's
// pairs, 32 at a time) from the gathered copy in L2 and its B fragments (the weights) straight
// from memory, so loads of several steps are in flight at once. Gate and up share the A
// fragments; the activation is applied on the accumulators and written, split again, in expert
// order for down, whose results go back to each pair's row for the combine.
//
// Whole 16-row tiles read up to 31 rows past an expert's last pair (the next expert's, or the
// scratch's padding: expert_scratch_rows), whose results are dropped.
#include <cuda_bf16.h>
#include <mma.h>

#include "moe/cuda/experts_parts.cuh"

namespace r3::moe::experts_detail {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 16;         // WMMA's M, N and K
constexpr int kPairTiles = 2;     // A tiles per pass: 32 pairs share each weight fragment
constexpr int kWarps = 4;         // per block, one 16-row weight tile each
constexpr int kRowsPerBlock = kWarps * kTile;

using FragA = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

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

// Row r of the gathered copy = hidden row of the pair order[r]'s token (zeros in the padding).
__global__ void gather_split(const float* __restrict__ hidden, int64_t k, Grouping g, int64_t pairs, int64_t rows,
                             SplitRows out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * out.width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.width, c = i % out.width;
    store_split(out, r, c, r < pairs ? hidden[(g.order[r] / k) * out.width + c] : 0.0f);
  }
}

// acc[t] += A tile t (rows first + 16t, both parts) · B (16 weight rows at w, stride ld)ᵀ over K,
// for the kTiles tiles that hold pairs.
template <int kB>
__device__ void multiply(const SplitRows& a, int64_t first, int tiles, const __nv_bfloat16* const (&w)[kB], int64_t ld,
                         FragC (&acc)[kB][kPairTiles]) {
  const __nv_bfloat16* hi = a.hi + first * a.width;
  const __nv_bfloat16* lo = a.lo + first * a.width;
#pragma unroll 2
  for (int64_t k0 = 0; k0 < a.width; k0 += kTile) {
    FragB b[kB];
#pragma unroll
    for (int m = 0; m < kB; ++m) wmma::load_matrix_sync(b[m], w[m] + k0, static_cast<unsigned>(ld));
#pragma unroll
    for (int t = 0; t < kPairTiles; ++t) {
      if (t >= tiles) break;
      FragA a_hi, a_lo;
      wmma::load_matrix_sync(a_hi, hi + t * kTile * a.width + k0, static_cast<unsigned>(a.width));
      wmma::load_matrix_sync(a_lo, lo + t * kTile * a.width + k0, static_cast<unsigned>(a.width));
#pragma unroll
      for (int m = 0; m < kB; ++m) {
        wmma::mma_sync(acc[m][t], a_hi, b[m], acc[m][t]);
        wmma::mma_sync(acc[m][t], a_lo, b[m], acc[m][t]);
      }
    }
  }
}

// The warp's place: its used-expert slot and first weight row, or false when it has none.
__device__ inline bool warp_tile(const Grouping& g, int64_t rows, int64_t* slot, int64_t* n0) {
  const int64_t tiles = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  *slot = blockIdx.x / tiles;
  *n0 = (blockIdx.x % tiles) * kRowsPerBlock + (threadIdx.x / 32) * kTile;
  return *slot < *g.used_count && *n0 < rows;
}

__global__ void __launch_bounds__(kWarps * 32) gate_up_tiles(SplitRows x, Grouping g,
                                                              const __nv_bfloat16* __restrict__ gate,
                                                              const __nv_bfloat16* __restrict__ up,
                                                              const float* __restrict__ gate_bias,
                                                              const float* __restrict__ up_bias, int64_t inter,
                                                              Activation act, SplitRows activated) {
  __shared__ __align__(32) float result[kWarps][2][kTile][kTile];  // gate, up
  int64_t slot, n0;
  if (!warp_tile(g, inter, &slot, &n0)) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot], end = g.offsets[e + 1];
  const __nv_bfloat16* const w[2] = {gate + (e * inter + n0) * x.width, up + (e * inter + n0) * x.width};
  for (int32_t first = g.offsets[e]; first < end; first += kTile * kPairTiles) {
    const int tiles = min(kPairTiles, (end - first + kTile - 1) / kTile);
    FragC acc[2][kPairTiles];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int t = 0; t < kPairTiles; ++t) wmma::fill_fragment(acc[m][t], 0.0f);
    }
    multiply<2>(x, first, tiles, w, x.width, acc);
#pragma unroll
    for (int t = 0; t < kPairTiles; ++t) {
      if (t >= tiles) break;
      wmma::store_matrix_sync(&result[warp][0][0][0], acc[0][t], kTile, wmma::mem_row_major);
      wmma::store_matrix_sync(&result[warp][1][0][0], acc[1][t], kTile, wmma::mem_row_major);
      __syncwarp();
      for (int i = lane; i < kTile * kTile; i += 32) {
        const int r = i / kTile, c = i % kTile;
        const int64_t row = first + t * kTile + r;
        if (row >= end) continue;
        float gs = result[warp][0][r][c], us = result[warp][1][r][c];
        if (gate_bias) gs += gate_bias[e * inter + n0 + c];
        if (up_bias) us += up_bias[e * inter + n0 + c];
        store_split(activated, row, n0 + c, act(gs, us));
      }
      __syncwarp();
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) down_tiles(SplitRows activated, Grouping g,
                                                           const __nv_bfloat16* __restrict__ down,
                                                           const float* __restrict__ down_bias, int64_t h,
                                                           float* __restrict__ expert_out) {
  __shared__ __align__(32) float result[kWarps][kTile][kTile];
  int64_t slot, n0;
  if (!warp_tile(g, h, &slot, &n0)) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot], end = g.offsets[e + 1];
  const __nv_bfloat16* const w[1] = {down + (e * h + n0) * activated.width};
  for (int32_t first = g.offsets[e]; first < end; first += kTile * kPairTiles) {
    const int tiles = min(kPairTiles, (end - first + kTile - 1) / kTile);
    FragC acc[1][kPairTiles];
#pragma unroll
    for (int t = 0; t < kPairTiles; ++t) wmma::fill_fragment(acc[0][t], 0.0f);
    multiply<1>(activated, first, tiles, w, activated.width, acc);
#pragma unroll
    for (int t = 0; t < kPairTiles; ++t) {
      if (t >= tiles) break;
      wmma::store_matrix_sync(&result[warp][0][0], acc[0][t], kTile, wmma::mem_row_major);
      __syncwarp();
      for (int i = lane; i < kTile * kTile; i += 32) {
        const int r = i / kTile, c = i % kTile;
        const int64_t row = first + t * kTile + r;
        if (row >= end) continue;
        const float y = result[warp][r][c];
        expert_out[static_cast<int64_t>(g.order[row]) * h + n0 + c] = down_bias ? y + down_bias[e * h + n0 + c] : y;
      }
      __syncwarp();
    }
  }
}

}  // namespace

// WMMA needs whole 16x16 tiles: both widths multiples of 16 (so every fragment's rows start on a
// 32-byte boundary of the 256-byte aligned buffers).
bool tensor_cores_fit(const DeviceExperts& x) {
  return x.gate.dtype() == DType::BF16 && x.gate.dim(1) % kTile == 0 && x.gate.dim(2) % kTile == 0;
}

void experts_on_tensor_cores(cudaStream_t stream, const float* hidden, int64_t k, const Grouping& g,
                             const DeviceExperts& x, const Activation& act, int64_t pairs, int64_t slots,
                             float* activated, float* expert_out) {
  const int64_t inter = x.gate.dim(1), h = x.gate.dim(2), rows = expert_scratch_rows(pairs);
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  // The gathered activations live in expert_out's scratch until down overwrites it; the
  // activated rows in activated's. Each holds rows x width floats: the two bfloat16 parts.
  auto* gathered = reinterpret_cast<__nv_bfloat16*>(expert_out);
  auto* act_parts = reinterpret_cast<__nv_bfloat16*>(activated);
  const SplitRows xs{gathered, gathered + rows * h, h}, as{act_parts, act_parts + rows * inter, inter};
  const auto blocks = [&](int64_t n) { return static_cast<unsigned>(slots * ((n + kRowsPerBlock - 1) / kRowsPerBlock)); };
  gather_split<<<static_cast<unsigned>(std::min<int64_t>((rows * h + 255) / 256, 65535)), 256, 0, stream>>>(
      hidden, k, g, pairs, rows, xs);
  gate_up_tiles<<<blocks(inter), kWarps * 32, 0, stream>>>(
      xs, g, static_cast<const __nv_bfloat16*>(x.gate.raw_data()), static_cast<const __nv_bfloat16*>(x.up.raw_data()),
      bias(x.gate_bias), bias(x.up_bias), inter, act, as);
  down_tiles<<<blocks(h), kWarps * 32, 0, stream>>>(as, g, static_cast<const __nv_bfloat16*>(x.down.raw_data()),
                                                    bias(x.down_bias), h, expert_out);
}

}  // namespace r3::moe::experts_detail
