// The routed experts on bfloat16 tensor cores, for steps whose experts have several pairs each:
// the pairs' float32 activations gathered in expert order and split into high and low bfloat16
// parts, then one warp per (used expert, 16 weight rows) running ops/cuda/mma_rows.cuh's
// swapped-operand MMAs over the expert's pairs, up to 32 per pass, with no block barrier. Gate
// and up share the activation fragments; the activation is applied on the accumulators and
// written, split again, in expert order for down, whose results go back to each pair's row for
// the combine.
#include <cuda_bf16.h>

#include "backend/cuda/launch.cuh"
#include "moe/cuda/experts_parts.cuh"
#include "ops/cuda/mma_rows.cuh"

namespace r3::moe::experts_detail {

namespace {

using namespace ops::cuda::mma_rows;
constexpr int kPairsPerTile = kColsPerTile;

constexpr int kWarps = 4;  // per block, one 16-row weight tile each
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

// Row r of the gathered copy = hidden row of the pair order[r]'s token.
__global__ void gather_split(const float* __restrict__ hidden, int64_t k, Grouping g, int64_t pairs, SplitRows out) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pairs * out.width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.width, c = i % out.width;
    store_split(out, r, c, hidden[(g.order[r] / k) * out.width + c]);
  }
}

// The warp's place: its used-expert slot and first weight row, or false when it has none.
__device__ inline bool warp_tile(const Grouping& g, int64_t rows, int64_t* slot, int64_t* n0) {
  const int64_t tiles = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  *slot = blockIdx.x / tiles;
  *n0 = (blockIdx.x % tiles) * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  return *slot < *g.used_count && *n0 < rows;
}

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
        const int32_t row = first + n * kPairsPerTile + acc_col(lane, i);
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
        const int32_t row = first + n * kPairsPerTile + acc_col(lane, i);
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
