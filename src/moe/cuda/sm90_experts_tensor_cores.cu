// The routed experts on bfloat16 tensor cores, for steps whose experts have several pairs each:
// the pairs' float32 activations gathered in expert order and split into high and low bfloat16
// parts, then one warp per (used expert, 16 weight rows) running ops/cuda/mma_rows.cuh's
// swapped-operand MMAs over the expert's pairs, up to 32 per pass, with no block barrier. Gate
// and up share the activation fragments; the activation is applied on the accumulators and
// written, split again, in expert order for down, whose results go back to each pair's row for
// the combine. The weights are bfloat16, or FP8 e4m3 with block scales (widened exactly to
// bfloat16 in registers, each K block's partial sums scaled: mma_rows::multiply_fp8).
#include <cuda_bf16.h>

#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "moe/cuda/experts_parts.cuh"
#include "ops/cuda/mma_rows.cuh"

namespace r3::moe::experts_detail {

namespace {

using namespace ops::cuda::mma_rows;
constexpr int kPairsPerTile = kColsPerTile;

constexpr int kWarps = 4;  // per block, one 16-row weight tile each
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

// The experts' stacked matrices [experts, rows, cols] as the kernels take them: tile(e, n0) is
// the 16-row tile of expert e from row n0, and multiply() the MMA loop for its kind.
struct Bf16Experts {
  const __nv_bfloat16* values;
  int64_t rows, cols;
  __device__ const __nv_bfloat16* tile(int64_t e, int64_t n0) const { return values + (e * rows + n0) * cols; }
};
struct Fp8Experts {
  const uint8_t* values;
  const float* scales;  // [experts, scale_rows, scale_cols]
  int64_t rows, cols, scale_rows, scale_cols;
  int32_t block_rows, block_cols;
  __device__ Fp8Tile tile(int64_t e, int64_t n0) const {
    return {values + (e * rows + n0) * cols, scales + (e * scale_rows + n0 / block_rows) * scale_cols, block_cols};
  }
};
// Either kind of tile keeps unroll_for(kN) K steps' loads in flight (mma_rows::multiply_fp8 for
// FP8).
template <int kB, int kN>
__device__ void multiply_tiles(const SplitRows& a, int64_t first, int64_t end, const __nv_bfloat16* const (&w)[kB],
                               float (&acc)[kB][kN][4]) {
  multiply<kB, kN, unroll_for(kN)>(a, first, end, w, acc);
}
template <int kB, int kN>
__device__ void multiply_tiles(const SplitRows& a, int64_t first, int64_t end, const Fp8Tile (&w)[kB],
                               float (&acc)[kB][kN][4]) {
  multiply_fp8<kB, kN, unroll_for(kN)>(a, first, end, w, acc);
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

// The warp's place: its used-expert slot and first weight row, or false when it has none.
__device__ inline bool warp_tile(const Grouping& g, int64_t rows, int64_t* slot, int64_t* n0) {
  const int64_t tiles = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  *slot = blockIdx.x / tiles;
  *n0 = (blockIdx.x % tiles) * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  return *slot < *g.used_count && *n0 < rows;
}

template <int kN, typename Experts, typename Act>
__global__ void __launch_bounds__(kWarps * 32) gate_up_tiles(SplitRows x, Grouping g, Experts gate, Experts up,
                                                              const float* __restrict__ gate_bias,
                                                              const float* __restrict__ up_bias, int64_t inter,
                                                              Act act, SplitRows activated) {
  backend::cuda::wait_for_predecessor();
  int64_t slot, n0;
  if (!warp_tile(g, inter, &slot, &n0)) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot], end = g.offsets[e + 1];
  using Tile = decltype(gate.tile(0, 0));
  const Tile w[2] = {gate.tile(e, n0), up.tile(e, n0)};
  for (int32_t first = g.offsets[e]; first < end; first += kPairsPerTile * kN) {
    float acc[2][kN][4] = {};
    multiply_tiles<2, kN>(x, first, end, w, acc);
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

template <int kN, typename Experts>
__global__ void __launch_bounds__(kWarps * 32) down_tiles(SplitRows activated, Grouping g, Experts down,
                                                           const float* __restrict__ down_bias, int64_t h,
                                                           float* __restrict__ expert_out) {
  backend::cuda::wait_for_predecessor();
  int64_t slot, n0;
  if (!warp_tile(g, h, &slot, &n0)) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t e = g.used[slot], end = g.offsets[e + 1];
  using Tile = decltype(down.tile(0, 0));
  const Tile w[1] = {down.tile(e, n0)};
  for (int32_t first = g.offsets[e]; first < end; first += kPairsPerTile * kN) {
    float acc[1][kN][4] = {};
    multiply_tiles<1, kN>(activated, first, end, w, acc);
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

template <int kN, typename Experts, typename Act>
void launch_tiles(cudaStream_t stream, const Grouping& g, const DeviceExperts& x, const Experts (&w)[3],
                    const Act& act, int64_t slots, const SplitRows& xs, const SplitRows& as, float* expert_out) {
  const int64_t inter = x.intermediate(), h = x.hidden();
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  const auto blocks = [&](int64_t n) { return static_cast<unsigned>(slots * ((n + kRowsPerBlock - 1) / kRowsPerBlock)); };
  backend::cuda::launch_kernel(gate_up_tiles<kN, Experts, Act>, blocks(inter), kWarps * 32, 0, stream, xs, g,
                               w[0], w[1], bias(x.gate_bias), bias(x.up_bias), inter, act, as);
  backend::cuda::launch_kernel(down_tiles<kN, Experts>, blocks(h), kWarps * 32, 0, stream, as, g, w[2],
                               bias(x.down_bias), h, expert_out);
}

// Pair columns per pass for the pairs an expert is likely to have; an expert with more takes
// another pass over its rows, which are then in L2.
template <typename Experts, typename Act>
void launch_for_pairs(cudaStream_t stream, const Grouping& g, const DeviceExperts& x, const Experts (&w)[3],
                      const Act& act, int64_t slots, int64_t likely_pairs, const SplitRows& xs,
                      const SplitRows& as, float* expert_out) {
  if (likely_pairs <= kPairsPerTile) launch_tiles<1>(stream, g, x, w, act, slots, xs, as, expert_out);
  else if (likely_pairs <= 2 * kPairsPerTile) launch_tiles<2>(stream, g, x, w, act, slots, xs, as, expert_out);
  else launch_tiles<4>(stream, g, x, w, act, slots, xs, as, expert_out);
}

}  // namespace

// Whole 16-row tiles and whole 32-position K steps: both widths multiples of 32 (so every
// 128-bit load is aligned in the 256-byte aligned buffers). FP8 experts also need their blocks to
// hold whole tiles and steps, and a step of reduced precision, that is of a model placed for
// bfloat16 (the tensor cores' split activations keep about 16 bits; --dtype float32 keeps the
// weight-streaming rows).
bool tensor_cores_fit(const DeviceExperts& x, bool reduced_precision) {
  const bool widths = x.intermediate() % kStepK == 0 && x.hidden() % kStepK == 0;
  if (x.gate.dtype() == DType::BF16) return widths;
  return x.gate.dtype() == DType::F8_E4M3 && reduced_precision && widths && x.block_rows % kRowsPerWarp == 0 &&
         x.block_cols % kStepK == 0;
}

template <typename Act>
void experts_on_tensor_cores(cudaStream_t stream, const float* hidden, int64_t k, const Grouping& g,
                             const DeviceExperts& x, const Act& act, int64_t pairs, int64_t slots,
                             int64_t likely_pairs, float* activated, float* expert_out) {
  const int64_t inter = x.gate.dim(1), h = x.gate.dim(2), rows = expert_scratch_rows(pairs);
  // The gathered activations live in expert_out's scratch until down overwrites it; the
  // activated rows in activated's. Each holds rows x width floats: the two bfloat16 parts.
  auto* gathered = reinterpret_cast<__nv_bfloat16*>(expert_out);
  auto* act_parts = reinterpret_cast<__nv_bfloat16*>(activated);
  const SplitRows xs{gathered, gathered + rows * h, h}, as{act_parts, act_parts + rows * inter, inter};
  backend::cuda::launch_kernel(gather_split, static_cast<unsigned>(std::min<int64_t>((pairs * h + 255) / 256, 65535)),
                               256, 0, stream, hidden, k, g, pairs, xs);
  if (x.gate.dtype() == DType::BF16) {
    const auto bf16 = [](const Tensor& t) {
      return Bf16Experts{static_cast<const __nv_bfloat16*>(t.raw_data()), t.dim(1), t.dim(2)};
    };
    const Bf16Experts w[3] = {bf16(x.gate), bf16(x.up), bf16(x.down)};
    return launch_for_pairs(stream, g, x, w, act, slots, likely_pairs, xs, as, expert_out);
  }
  const auto fp8 = [&](const Tensor& t, const Tensor& s) {
    return Fp8Experts{static_cast<const uint8_t*>(t.raw_data()), s.data<float>(), t.dim(1), t.dim(2), s.dim(1),
                      s.dim(2), static_cast<int32_t>(x.block_rows), static_cast<int32_t>(x.block_cols)};
  };
  const Fp8Experts w[3] = {fp8(x.gate, x.gate_scales), fp8(x.up, x.up_scales), fp8(x.down, x.down_scales)};
  launch_for_pairs(stream, g, x, w, act, slots, likely_pairs, xs, as, expert_out);
}

template void experts_on_tensor_cores<Activation>(cudaStream_t, const float*, int64_t, const Grouping&,
                                                const DeviceExperts&, const Activation&, int64_t, int64_t, int64_t,
                                                float*, float*);
template void experts_on_tensor_cores<SituActivation>(cudaStream_t, const float*, int64_t, const Grouping&,
                                                    const DeviceExperts&, const SituActivation&, int64_t, int64_t,
                                                    int64_t, float*, float*);

}  // namespace r3::moe::experts_detail
