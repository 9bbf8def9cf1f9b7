// The routed experts on bfloat16 tensor cores (WMMA 16x16x16, float32 accumulators), for steps
// whose experts have several pairs each: one block per (used expert, 64 weight rows), its four
// warps 16 rows each, taking the expert's pairs 16 at a time. The pairs' float32 activations are
// staged in shared memory split into high and low bfloat16 parts (x = hi + lo to about 16
// significant bits, as ops/cuda/split_bf16.h does for the dense projections) and both parts
// multiply the same weight fragments into one accumulator, which the weights are read from
// global memory straight into. Gate and up share the staged activations and the activation is
// applied on the accumulators; down reads the activated rows the same way.
#include <cuda_bf16.h>
#include <mma.h>

#include "moe/cuda/experts_parts.cuh"

namespace r3::moe::experts_detail {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 16;                  // WMMA's M, N and K
constexpr int kWarps = 4;                  // per block, kTile weight rows each
constexpr int kRowsPerBlock = kWarps * kTile;
constexpr int kStage = 128;                // activation columns staged per round

using FragA = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

struct Staged {
  __nv_bfloat16 hi[kTile][kStage];
  __nv_bfloat16 lo[kTile][kStage];
};

// Stages columns [k0, k0 + width) of the `count` rows x_row(r) (zeros past count), split.
template <typename RowOf>
__device__ void stage(Staged& s, RowOf x_row, int count, int64_t k0, int width) {
  for (int i = threadIdx.x; i < kTile * width; i += blockDim.x) {
    const int r = i / width, c = i % width;
    const float v = r < count ? x_row(r)[k0 + c] : 0.0f;
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    s.hi[r][c] = hi;
    s.lo[r][c] = __float2bfloat16_rn(v - __bfloat162float(hi));
  }
}

// acc += staged [16, width] · w[16 rows of stride ld, columns k0 + [0, width)]ᵀ, both parts.
__device__ void multiply(const Staged& s, const __nv_bfloat16* w, int64_t ld, int64_t k0, int width, FragC& acc) {
#pragma unroll 4
  for (int kk = 0; kk < width; kk += kTile) {
    FragA a_hi, a_lo;
    FragB b;
    wmma::load_matrix_sync(b, w + k0 + kk, static_cast<unsigned>(ld));
    wmma::load_matrix_sync(a_hi, &s.hi[0][kk], kStage);
    wmma::load_matrix_sync(a_lo, &s.lo[0][kk], kStage);
    wmma::mma_sync(acc, a_hi, b, acc);
    wmma::mma_sync(acc, a_lo, b, acc);
  }
}

__global__ void __launch_bounds__(kWarps * 32) gate_up_tiles(const float* __restrict__ hidden, int64_t k, Grouping g,
                                                              const __nv_bfloat16* __restrict__ gate,
                                                              const __nv_bfloat16* __restrict__ up,
                                                              const float* __restrict__ gate_bias,
                                                              const float* __restrict__ up_bias, int64_t h,
                                                              int64_t inter, Activation act,
                                                              float* __restrict__ activated) {
  __shared__ __align__(32) Staged staged;
  __shared__ __align__(32) float result[kWarps][2][kTile][kTile];  // gate, up
  const int64_t tiles = (inter + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t slot = blockIdx.x / tiles;
  if (slot >= *g.used_count) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot];
  const int64_t n0 = (blockIdx.x % tiles) * kRowsPerBlock + warp * kTile;
  const bool active = n0 < inter;  // inactive warps still stage and synchronise
  const __nv_bfloat16* gw = gate + (e * inter + n0) * h;
  const __nv_bfloat16* uw = up + (e * inter + n0) * h;
  for (int32_t first = g.offsets[e]; first < g.offsets[e + 1]; first += kTile) {
    const int count = min(kTile, g.offsets[e + 1] - first);
    FragC acc_g, acc_u;
    wmma::fill_fragment(acc_g, 0.0f);
    wmma::fill_fragment(acc_u, 0.0f);
    for (int64_t k0 = 0; k0 < h; k0 += kStage) {
      const int width = static_cast<int>(min(static_cast<int64_t>(kStage), h - k0));
      __syncthreads();
      stage(staged, [&](int r) { return hidden + (g.order[first + r] / k) * h; }, count, k0, width);
      __syncthreads();
      if (active) {
        multiply(staged, gw, h, k0, width, acc_g);
        multiply(staged, uw, h, k0, width, acc_u);
      }
    }
    if (active) {
      wmma::store_matrix_sync(&result[warp][0][0][0], acc_g, kTile, wmma::mem_row_major);
      wmma::store_matrix_sync(&result[warp][1][0][0], acc_u, kTile, wmma::mem_row_major);
      __syncwarp();
      for (int i = lane; i < kTile * kTile; i += 32) {
        const int r = i / kTile, c = i % kTile;
        if (r >= count) continue;
        const int64_t row = e * inter + n0 + c;
        float gs = result[warp][0][r][c], us = result[warp][1][r][c];
        if (gate_bias) gs += gate_bias[row];
        if (up_bias) us += up_bias[row];
        activated[static_cast<int64_t>(g.order[first + r]) * inter + n0 + c] = act(gs, us);
      }
      __syncwarp();
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) down_tiles(const float* __restrict__ activated, Grouping g,
                                                           const __nv_bfloat16* __restrict__ down,
                                                           const float* __restrict__ down_bias, int64_t h,
                                                           int64_t inter, float* __restrict__ expert_out) {
  __shared__ __align__(32) Staged staged;
  __shared__ __align__(32) float result[kWarps][kTile][kTile];
  const int64_t tiles = (h + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t slot = blockIdx.x / tiles;
  if (slot >= *g.used_count) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot];
  const int64_t n0 = (blockIdx.x % tiles) * kRowsPerBlock + warp * kTile;
  const bool active = n0 < h;
  const __nv_bfloat16* w = down + (e * h + n0) * inter;
  for (int32_t first = g.offsets[e]; first < g.offsets[e + 1]; first += kTile) {
    const int count = min(kTile, g.offsets[e + 1] - first);
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int64_t k0 = 0; k0 < inter; k0 += kStage) {
      const int width = static_cast<int>(min(static_cast<int64_t>(kStage), inter - k0));
      __syncthreads();
      stage(staged, [&](int r) { return activated + static_cast<int64_t>(g.order[first + r]) * inter; }, count, k0,
            width);
      __syncthreads();
      if (active) multiply(staged, w, inter, k0, width, acc);
    }
    if (active) {
      wmma::store_matrix_sync(&result[warp][0][0], acc, kTile, wmma::mem_row_major);
      __syncwarp();
      for (int i = lane; i < kTile * kTile; i += 32) {
        const int r = i / kTile, c = i % kTile;
        if (r >= count) continue;
        const float y = result[warp][r][c];
        expert_out[static_cast<int64_t>(g.order[first + r]) * h + n0 + c] = down_bias ? y + down_bias[e * h + n0 + c] : y;
      }
      __syncwarp();
    }
  }
}

}  // namespace

// WMMA needs whole 16x16 tiles: both widths multiples of 16 (so every fragment's rows start on a
// 32-byte boundary of the 256-byte aligned weights).
bool tensor_cores_fit(const DeviceExperts& x) {
  return x.gate.dtype() == DType::BF16 && x.gate.dim(1) % kTile == 0 && x.gate.dim(2) % kTile == 0;
}

void experts_on_tensor_cores(cudaStream_t stream, const float* hidden, int64_t k, const Grouping& g,
                             const DeviceExperts& x, const Activation& act, int64_t slots, float* activated,
                             float* expert_out) {
  const int64_t inter = x.gate.dim(1), h = x.gate.dim(2);
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  const auto* gw = static_cast<const __nv_bfloat16*>(x.gate.raw_data());
  const auto* uw = static_cast<const __nv_bfloat16*>(x.up.raw_data());
  const auto* dw = static_cast<const __nv_bfloat16*>(x.down.raw_data());
  const auto blocks = [&](int64_t rows) {
    return static_cast<unsigned>(slots * ((rows + kRowsPerBlock - 1) / kRowsPerBlock));
  };
  gate_up_tiles<<<blocks(inter), kWarps * 32, 0, stream>>>(hidden, k, g, gw, uw, bias(x.gate_bias), bias(x.up_bias), h,
                                                           inter, act, activated);
  down_tiles<<<blocks(h), kWarps * 32, 0, stream>>>(activated, g, dw, bias(x.down_bias), h, inter, expert_out);
}

}  // namespace r3::moe::experts_detail
