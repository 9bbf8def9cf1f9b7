// The fused experts kernels (moe/device_experts.h). First the step's (token, choice) pairs are
// grouped by expert on the device (counts, offsets, the list of used experts; the order of pairs
// within an expert does not matter, each pair's sums are its own). Then one warp per (used
// expert, weight row) reads that row once and multiplies it with every pair routed to the
// expert, in groups of up to kMaxPairsPerPass that keep their partial sums in registers; the lanes take
// every 32nd element and the partial sums meet through shuffles. Gate/up + activation, then down,
// then the combine per (token, hidden element), summing the k choices in order as the CPU does
// (each product rounded, then added). Launches are sized for every expert being used; warps
// past the used count return at once, so nothing is read back to the host. Decode steps of a few
// tokens take a shorter way with the same arithmetic (kPairMajorTokens).
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "moe/device_experts.h"
#include "moe/cuda/fused_experts_of_ids.h"
#include "moe/cuda/down_rows_in_flight.cuh"
#include "moe/cuda/experts_by_pair.cuh"
#include "moe/cuda/experts_parts.cuh"
#include "ops/cuda/warp_row_dots.cuh"

namespace r3::moe {

namespace {

using experts_detail::Grouping;
using ops::cuda::kWarp;
using ops::cuda::row_of;
using ops::cuda::warp_sum;
using ops::cuda::row_dots;
constexpr int kWarpsPerBlock = 8;

// Pairs a warp multiplies per pass over its weight row, at most: 8, or fewer when the step has
// fewer tokens (an expert has at most one pair per token), so that a decode step's warps hold
// only the partial sums they use and more of them fit on an SM.
constexpr int kMaxPairsPerPass = 8;

// ids [pairs] -> offsets [experts + 1], order [pairs] (pair indices grouped by expert), used
// [experts] (the experts with pairs, ascending), used_count [1]. One block.
__global__ void group_pairs_by_expert(const int32_t* __restrict__ ids, int32_t id_base, int64_t pairs, int64_t experts,
                                      int32_t* __restrict__ offsets, int32_t* __restrict__ order,
                                      int32_t* __restrict__ used, int32_t* __restrict__ used_count) {
  backend::cuda::wait_for_predecessor();
  extern __shared__ int32_t counts[];  // [experts] counts, then [experts] cursors
  int32_t* cursor = counts + experts;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&counts[ids[p] - id_base], 1);
  __syncthreads();
  // Offsets and the used list by the first warp: each lane scans a contiguous range of experts,
  // the lanes' totals meet in a warp-wide exclusive scan (a serial loop over every expert on one
  // thread was a few microseconds of every MoE layer).
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    const int64_t per_lane = (experts + 31) / 32, begin = min(experts, lane * per_lane), end = min(experts, begin + per_lane);
    int32_t total = 0, n_used = 0;
    for (int64_t e = begin; e < end; ++e) {
      total += counts[e];
      n_used += counts[e] > 0;
    }
    int32_t total_before = total, used_before = n_used;  // inclusive scans, then made exclusive
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t t = __shfl_up_sync(0xffffffffu, total_before, offset);
      const int32_t u = __shfl_up_sync(0xffffffffu, used_before, offset);
      if (lane >= offset) {
        total_before += t;
        used_before += u;
      }
    }
    total_before -= total;
    used_before -= n_used;
    for (int64_t e = begin; e < end; ++e) {
      offsets[e] = total_before;
      cursor[e] = total_before;
      total_before += counts[e];
      if (counts[e] > 0) used[used_before++] = static_cast<int32_t>(e);
    }
    if (lane == 31) {
      offsets[experts] = total_before;
      *used_count = used_before;
    }
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    order[atomicAdd(&cursor[ids[p] - id_base], 1)] = static_cast<int32_t>(p);
  }
}



template <typename Matrix, bool kVec8, int kPairsPerPass, typename Act>
__global__ void gate_up_rows(const float* __restrict__ hidden, int64_t k, Grouping g, Matrix gate, Matrix up,
                             const float* __restrict__ gate_bias,
                             const float* __restrict__ up_bias, int64_t h, int64_t inter, Act act,
                             float* __restrict__ activated) {
  backend::cuda::wait_for_predecessor();
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int64_t slot = warp / inter, i = warp % inter;
  if (slot >= *g.used_count) return;
  const int lane = threadIdx.x % kWarp;
  const int32_t e = g.used[slot];
  const int64_t row = e * inter + i;
  const decltype(row_of(gate, 0)) gate_up[2] = {row_of(gate, row), row_of(up, row)};
  for (int32_t first = g.offsets[e]; first < g.offsets[e + 1]; first += kPairsPerPass) {
    const int32_t n = min(kPairsPerPass, g.offsets[e + 1] - first);
    const float* x[kPairsPerPass];
    float acc[2][kPairsPerPass];  // gate, up
#pragma unroll
    for (int j = 0; j < kPairsPerPass; ++j) {
      x[j] = j < n ? hidden + (g.order[first + j] / k) * h : nullptr;
      acc[0][j] = acc[1][j] = 0.0f;
    }
    row_dots<kVec8>(gate_up, x, n, h, lane, acc);
#pragma unroll
    for (int j = 0; j < kPairsPerPass; ++j) {
      acc[0][j] = warp_sum(acc[0][j]);
      acc[1][j] = warp_sum(acc[1][j]);
    }
    if (lane == 0) {
      for (int j = 0; j < n; ++j) {
        float gs = acc[0][j], us = acc[1][j];
        if (gate_bias) gs += gate_bias[row];
        if (up_bias) us += up_bias[row];
        activated[static_cast<int64_t>(g.order[first + j]) * inter + i] = act(gs, us);
      }
    }
  }
}

template <typename Matrix, bool kVec8, int kPairsPerPass>
__global__ void down_rows(const float* __restrict__ activated, Grouping g, Matrix down,
                          const float* __restrict__ down_bias, int64_t h, int64_t inter, float* __restrict__ expert_out) {
  backend::cuda::wait_for_predecessor();
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int64_t slot = warp / h, d = warp % h;
  if (slot >= *g.used_count) return;
  const int lane = threadIdx.x % kWarp;
  const int32_t e = g.used[slot];
  const decltype(row_of(down, 0)) w[1] = {row_of(down, e * h + d)};
  for (int32_t first = g.offsets[e]; first < g.offsets[e + 1]; first += kPairsPerPass) {
    const int32_t n = min(kPairsPerPass, g.offsets[e + 1] - first);
    const float* a[kPairsPerPass];
    float acc[1][kPairsPerPass];
#pragma unroll
    for (int j = 0; j < kPairsPerPass; ++j) {
      a[j] = j < n ? activated + static_cast<int64_t>(g.order[first + j]) * inter : nullptr;
      acc[0][j] = 0.0f;
    }
    row_dots<kVec8>(w, a, n, inter, lane, acc);
#pragma unroll
    for (int j = 0; j < kPairsPerPass; ++j) acc[0][j] = warp_sum(acc[0][j]);
    if (lane == 0) {
      for (int j = 0; j < n; ++j) {
        const float y = acc[0][j];
        expert_out[static_cast<int64_t>(g.order[first + j]) * h + d] = down_bias ? y + down_bias[e * h + d] : y;
      }
    }
  }
}

__global__ void combine_choices(const float* __restrict__ expert_out, const float* __restrict__ weights, int64_t tokens,
                                int64_t k, int64_t h, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * h) return;
  const int64_t t = i / h, d = i % h;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum = __fadd_rn(sum, __fmul_rn(weights[t * k + j], expert_out[(t * k + j) * h + d]));
  out[i] = sum;
}

// Steps of at most kPairMajorTokens tokens (decode of a few sequences) skip the grouping: one warp
// per (pair, row) for gate/up, which reads an expert's rows once per token choosing it (the
// second time mostly from L2), and for down one warp per (token, hidden row) that takes the
// token's k choices and sums their results in order as combine_choices does (the combine inside
// the down kernel). Every dot product, bias and sum is the grouped kernels' own, in the same
// order, so both paths give the same bits and a step may take either even with
// --batch-invariant; a decode step saves the grouping and combine launches.

// Gate/up at one token: groups of eight a lane keeps in flight a row, fewer than the row type's
// default, so that the kernel's registers let one wave of blocks hold every (pair, intermediate
// row) of Qwen3-30B-A3B (768 blocks of 8 warps on 132 SMs: 6 blocks an SM, 40 registers a
// thread, some spilled), where the default shape (bf16: 4 groups, FP8: 8) runs in about two
// waves. The kernel choice gate_up_one_wave (backend/cuda/kernel_choices.h), by rule for FP8
// weights. Same bits.
constexpr int kOneWaveGroups = 2;
constexpr int kOneWaveBlocks = 6;
template <typename Matrix>
bool one_wave_taken(const backend::cuda::KernelChoices& choices) {
  return choices.gate_up_one_wave_taken(std::is_same_v<Matrix, ops::cuda::Fp8Matrix>);
}

template <typename Matrix, bool kVec8, typename Act, bool kLaneScales = false, int kGroups = 0, int kMinBlocks = 1>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, kMinBlocks)
    gate_up_by_pair(const float* __restrict__ hidden, const int32_t* __restrict__ ids, int64_t pairs, int64_t k,
                    Matrix gate, Matrix up, const float* __restrict__ gate_bias, const float* __restrict__ up_bias,
                    int64_t h, int64_t inter, Act act, float* __restrict__ activated, bool release) {
  backend::cuda::wait_for_predecessor();
  if (release) backend::cuda::release_successor();  // down + combine loads its rows meanwhile
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int64_t p = warp / inter, i = warp % inter;
  if (p >= pairs) return;
  experts_detail::gate_up_pair_row<kVec8, Matrix, Act, kLaneScales, kGroups>(
      hidden, ids, k, p, i, gate, up, gate_bias, up_bias, h, inter, act, activated,
      static_cast<int>(threadIdx.x % kWarp));
}

template <typename Matrix, bool kVec8>
__global__ void down_and_combine_by_token(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                                          const float* __restrict__ weights, int64_t tokens, int64_t k, Matrix down,
                                          const float* __restrict__ down_bias, int64_t h, int64_t inter,
                                          float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= tokens * h) return;
  experts_detail::down_and_combine_row_in_warp<kVec8>(activated, ids, weights, k, down, down_bias, h, inter, warp / h,
                                                      warp % h, out, static_cast<int>(threadIdx.x % kWarp));
}

// The same for a step of one token: a block per hidden row, its warps taking the choices, the
// choices' results summed by thread 0 in order (a warp per row measured 13.2 -> 14.8 us a
// layer at one token in a serialised profile, FP8 experts 37.2 -> 39.8 us in the kernel bench;
// it pays from two tokens). Same bits.
// With wide loads, each warp issues its first choice's first round of row loads before it waits
// for gate/up (backend/cuda/launch.cuh): the ids come from the routing before gate/up, which has
// finished once gate/up, having waited for it, releases this kernel; the weights are no kernel's
// output. So the rows come from memory while gate/up's last blocks run.
// kLaneScales (FP8 rows whose scales fit the lanes over inter, ops::cuda::fp8_lane_scales_fit):
// the first choice's scales are loaded a lane each with those rows, before the wait, instead of
// a load a group after it, one more trip to memory on the step's critical path. Same bits.
template <typename Matrix, bool kVec8, bool kLaneScales = false>
__device__ __forceinline__ void down_and_combine_token_row(const float* __restrict__ activated,
                                                           const int32_t* __restrict__ ids,
                                                           const float* __restrict__ weights, int64_t k, Matrix down,
                                                           const float* __restrict__ down_bias, int64_t h,
                                                           int64_t inter, float* __restrict__ out) {
  extern __shared__ float choice_out[];  // [k] results, then [k] routing weights
  float* const choice_weight = choice_out + k;
  const int64_t d = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  const int64_t first_choice = threadIdx.x / kWarp;
  using Row = decltype(row_of(down, 0));
  const Row first_row[1] = {row_of(down, first_choice < k ? ids[first_choice] * h + d : 0)};
  ops::cuda::RoundOf<Row, 1> first_round;
  using Widen = std::conditional_t<kLaneScales, ops::cuda::Fp8LaneScales<1>, ops::cuda::WidenByRow>;
  Widen widen{};
  if constexpr (kVec8) {
    if (first_choice < k) {
      ops::cuda::first_round_loads(first_row, inter, lane, first_round);
      if constexpr (kLaneScales) widen = ops::cuda::fp8_lane_scales(first_row, 0, inter, lane);
    }
  }
  // The routing weights, like the ids, come from the routing before gate/up: loaded before the
  // wait, so that thread 0's sum at the end does not wait on them.
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) choice_weight[j] = weights[j];
  backend::cuda::wait_for_predecessor();
  const auto keep = [&](int64_t j, float partial) {
    const float y = warp_sum(partial);
    if (lane == 0) choice_out[j] = down_bias ? y + down_bias[ids[j] * h + d] : y;
  };
  if (first_choice < k) {
    const float* const a[1] = {activated + first_choice * inter};
    float acc[1][1] = {{0.0f}};
    if constexpr (kVec8) ops::cuda::row_dots_after_first_round(first_row, a, 1, inter, lane, first_round, acc, 0, widen);
    else row_dots<false>(first_row, a, 1, inter, lane, acc);
    keep(first_choice, acc[0][0]);
  }
  for (int64_t j = first_choice + warps; j < k; j += warps) {  // (k above the block's warps)
    const Row w[1] = {row_of(down, ids[j] * h + d)};
    const float* const a[1] = {activated + j * inter};
    float acc[1][1] = {{0.0f}};
    row_dots<kVec8>(w, a, 1, inter, lane, acc);
    keep(j, acc[0][0]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum = __fadd_rn(sum, __fmul_rn(choice_weight[j], choice_out[j]));
    out[d] = sum;
  }
}

template <typename Matrix, bool kVec8>
__global__ void down_and_combine_one_token(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                                           const float* __restrict__ weights, int64_t k, Matrix down,
                                           const float* __restrict__ down_bias, int64_t h, int64_t inter,
                                           float* __restrict__ out) {
  down_and_combine_token_row<Matrix, kVec8>(activated, ids, weights, k, down, down_bias, h, inter, out);
}
// The same held to kMinBlocks blocks an SM. Six (40 registers, some spilled): Qwen3-30B-A3B's
// 2048 one-row blocks run in fewer waves; the kernel choice down_six_blocks
// (backend/cuda/kernel_choices.h), by rule for FP8 with the scales from the lanes, whose rows are
// half as long as bfloat16's. Four: FP8 with the scales from the lanes held to the registers it
// takes without them, where that choice is forced off. Same bits.
template <typename Matrix, bool kVec8, bool kLaneScales, int kMinBlocks>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, kMinBlocks)
    down_and_combine_one_token_held(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                                    const float* __restrict__ weights, int64_t k, Matrix down,
                                    const float* __restrict__ down_bias, int64_t h, int64_t inter,
                                    float* __restrict__ out) {
  down_and_combine_token_row<Matrix, kVec8, kLaneScales>(activated, ids, weights, k, down, down_bias, h, inter, out);
}

// Down + combine at one token with a block's rows in flight before its wait
// (down_rows_in_flight.cuh), where it fits: the kernel choice down_rows_in_flight
// (backend/cuda/kernel_choices.h), by rule for FP8 rows whose scales fit the lanes, eight rows a
// block; bfloat16 rows, twice as long, four rows a block. Same bits. Returns whether it launched.
template <typename Matrix>
bool launch_down_rows_in_flight(cudaStream_t stream, const backend::cuda::KernelChoices& choices, const float* activated,
                                const int32_t* ids, const float* weights, int64_t k, Matrix down,
                                const float* down_bias, int64_t h, int64_t inter, int64_t block_cols, float* out) {
  constexpr bool kFp8 = std::is_same_v<Matrix, ops::cuda::Fp8Matrix>;
  constexpr bool kBf16 = std::is_same_v<Matrix, ops::cuda::PlainMatrix<__nv_bfloat16>>;
  if constexpr (kFp8 || kBf16) {
    if (!experts_detail::down_rows_in_flight_fit(k, h, inter)) return false;
    if (kFp8 && !ops::cuda::fp8_lane_scales_fit(0, inter, block_cols)) return false;
    if (!choices.down_rows_in_flight_taken(kFp8)) return false;
    auto with_shape = [&](auto rows_tag, auto min_blocks_tag) {
      constexpr int kRows = decltype(rows_tag)::value, kMinBlocks = decltype(min_blocks_tag)::value;
      auto with_groups = [&](auto groups_tag) {
        constexpr int kGroups = decltype(groups_tag)::value;
        backend::cuda::launch_kernel(
            experts_detail::down_and_combine_rows_in_flight<Matrix, kRows, kMinBlocks, kGroups, kFp8>,
            static_cast<unsigned>(h / kRows), static_cast<unsigned>(k * kWarp), 0, stream, activated, ids, weights, k,
            down, down_bias, h, inter, out);
      };
      switch ((inter + 255) / 256) {
        case 1: with_groups(std::integral_constant<int, 1>{}); break;
        case 2: with_groups(std::integral_constant<int, 2>{}); break;
        case 3: with_groups(std::integral_constant<int, 3>{}); break;
        default: with_groups(std::integral_constant<int, 4>{}); break;
      }
    };
    if constexpr (kFp8) {
      with_shape(std::integral_constant<int, 8>{}, std::integral_constant<int, 2>{});
    } else {
      with_shape(std::integral_constant<int, 4>{}, std::integral_constant<int, 2>{});
    }
    return true;
  }
  return false;
}

unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The tensor-core path once the experts have a few pairs each on average (batch 64 of
// Qwen3-30B-A3B: 4): below, its 16-row tiles are mostly empty and the weight-streaming rows read
// the same bytes with less latency. Not for a batch-invariant context: which path a step takes
// depends on its size.
bool use_tensor_cores(const backend::Context& ctx, const DeviceExperts& x, int64_t pairs, int64_t experts) {
  return !ctx.batch_invariant() && experts_detail::tensor_cores_fit(x, ctx.reduced_precision()) && pairs >= 2 * experts;
}

template <typename Matrix, typename Act>
void launch(backend::Context& ctx, const Tensor& hidden, const int32_t* ids, const float* weights, int64_t k,
            const DeviceExperts& x, const Act& act, Matrix gw, Matrix uw, Matrix dw, Tensor& grouping,
            Tensor& activated, Tensor& expert_out, Tensor& out, bool always_grouped) {
  const backend::cuda::State& state = ctx.cuda_state();
  const cudaStream_t stream = state.stream;
  const int64_t tokens = hidden.dim(0), h = hidden.dim(1), experts = x.gate.dim(0), inter = x.intermediate();
  const int64_t pairs = tokens * k;
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  const bool vec8 = experts_detail::experts_vec8(x);
  constexpr unsigned kThreads = kWarpsPerBlock * kWarp;
  if (tokens <= kPairMajorTokens && !always_grouped) {
    const bool one_wave = tokens == 1 && one_wave_taken<Matrix>(state.choices);
    auto pair_major = [&](auto vec8_tag) {
      constexpr bool kVec8 = decltype(vec8_tag)::value;
      // The kernel for the rows' scales (FP8 scales from the lanes or not) and one_wave.
      auto gate_up_for = [&](auto lanes_tag) {
        constexpr bool kLanes = decltype(lanes_tag)::value;
        constexpr bool kOneWaveTaken = kVec8 && (std::is_same_v<Matrix, ops::cuda::Fp8Matrix> ||
                                                 std::is_same_v<Matrix, ops::cuda::PlainMatrix<__nv_bfloat16>>);
        if constexpr (kOneWaveTaken) {
          if (one_wave) return gate_up_by_pair<Matrix, kVec8, Act, kLanes, kOneWaveGroups, kOneWaveBlocks>;
        }
        return gate_up_by_pair<Matrix, kVec8, Act, kLanes>;
      };
      auto gate_up = gate_up_for(std::false_type{});
      if constexpr (kVec8 && std::is_same_v<Matrix, ops::cuda::Fp8Matrix>) {
        // The scales from the lanes where they fit: fewer registers than a load a group, so more
        // blocks an SM.
        if (ops::cuda::fp8_lane_scales_fit(0, h, x.block_cols)) {
          gate_up = gate_up_for(std::true_type{});
        }
      }
      backend::cuda::launch_kernel(gate_up, warp_blocks(pairs * inter), kThreads, 0, stream,
                                   hidden.data<float>(), ids, pairs, k, gw, uw, bias(x.gate_bias), bias(x.up_bias), h,
                                   inter, act, activated.data<float>(), /*release=*/tokens == 1);
      const bool down_launched =
          tokens == 1 && kVec8 &&
          launch_down_rows_in_flight(stream, state.choices, activated.data<float>(), ids, weights, k, dw,
                                     bias(x.down_bias), h, inter, x.block_cols, out.data<float>());
      if (down_launched) return;
      if (tokens == 1) {
        const auto choice_warps = static_cast<unsigned>(std::min<int64_t>(k, kWarpsPerBlock));
        auto down = down_and_combine_one_token<Matrix, kVec8>;
        if constexpr (kVec8 && std::is_same_v<Matrix, ops::cuda::Fp8Matrix>) {
          // The scales from the lanes where they fit, as gate/up's.
          if (ops::cuda::fp8_lane_scales_fit(0, inter, x.block_cols)) {
            down = state.choices.down_six_blocks_taken(true)
                       ? down_and_combine_one_token_held<ops::cuda::Fp8Matrix, true, true, 6>
                       : down_and_combine_one_token_held<ops::cuda::Fp8Matrix, true, true, 4>;
          }
        }
        if constexpr (kVec8 && std::is_same_v<Matrix, ops::cuda::PlainMatrix<__nv_bfloat16>>) {
          if (state.choices.down_six_blocks_taken(false)) {
            down = down_and_combine_one_token_held<Matrix, true, false, 6>;
          }
        }
        backend::cuda::launch_kernel(down, static_cast<unsigned>(h), choice_warps * kWarp, 2 * k * sizeof(float), stream,
                                     activated.data<float>(), ids, weights, k, dw, bias(x.down_bias), h, inter,
                                     out.data<float>());
      } else {
        backend::cuda::launch_kernel(down_and_combine_by_token<Matrix, kVec8>, warp_blocks(tokens * h), kThreads, 0,
                                     stream, activated.data<float>(), ids, weights, tokens, k, dw, bias(x.down_bias),
                                     h, inter, out.data<float>());
      }
    };
    if (vec8) pair_major(std::true_type{});
    else pair_major(std::false_type{});
    R3_CUDA_CHECK(cudaGetLastError());
    return;
  }
  int32_t* gp = grouping.data<int32_t>();
  const Grouping g{gp, gp + experts + 1, gp + experts + 1 + pairs, gp + 2 * experts + 1 + pairs};
  backend::cuda::launch_kernel(group_pairs_by_expert, 1, 1024, 2 * experts * sizeof(int32_t), stream, ids, x.first,
                               pairs, experts, gp, gp + experts + 1, gp + experts + 1 + pairs,
                               gp + 2 * experts + 1 + pairs);
  // Sized for every expert being used (at most `pairs` of them).
  const int64_t slots = std::min(experts, pairs);
  const unsigned gate_blocks = warp_blocks(slots * inter), down_blocks = warp_blocks(slots * h);
  // Partial sums for the pairs an expert is likely to have (at most one per token, about
  // pairs / experts on average); an expert with more takes another pass over its rows, which
  // are then in L2.
  const int64_t likely = std::min(tokens, std::max<int64_t>(1, 2 * ((pairs + experts - 1) / experts)));
  if (use_tensor_cores(ctx, x, pairs, experts)) {
    experts_detail::experts_on_tensor_cores(stream, hidden.data<float>(), k, g, x, act, pairs, slots, likely,
                                            activated.data<float>(), expert_out.data<float>());
  } else {
    auto rows = [&](auto vec8_tag, auto pairs_tag) {
      constexpr bool kVec8 = decltype(vec8_tag)::value;
      constexpr int kPairs = decltype(pairs_tag)::value;
      backend::cuda::launch_kernel(gate_up_rows<Matrix, kVec8, kPairs, Act>, gate_blocks, kThreads, 0, stream,
                                   hidden.data<float>(), k, g, gw, uw, bias(x.gate_bias), bias(x.up_bias), h, inter,
                                   act, activated.data<float>());
      backend::cuda::launch_kernel(down_rows<Matrix, kVec8, kPairs>, down_blocks, kThreads, 0, stream,
                                   activated.data<float>(), g, dw, bias(x.down_bias), h, inter,
                                   expert_out.data<float>());
    };
    auto by_pairs = [&](auto vec8_tag) {
      if (likely <= 1) rows(vec8_tag, std::integral_constant<int, 1>{});
      else if (likely <= 2) rows(vec8_tag, std::integral_constant<int, 2>{});
      else if (likely <= 4) rows(vec8_tag, std::integral_constant<int, 4>{});
      else rows(vec8_tag, std::integral_constant<int, kMaxPairsPerPass>{});
    };
    if (vec8) by_pairs(std::true_type{});
    else by_pairs(std::false_type{});
  }
  backend::cuda::launch_kernel(combine_choices, static_cast<unsigned>((tokens * h + 255) / 256), 256, 0, stream,
                               expert_out.data<float>(), weights, tokens, k, h, out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

template <typename Matrix, typename Act>
void launch_grouped_rows(cudaStream_t stream, const Tensor& rows, const Grouping& g, int64_t slots, int64_t likely,
                         const DeviceExperts& x, const Act& act, Matrix gw, Matrix uw, Matrix dw, Tensor& activated,
                         Tensor& out) {
  const int64_t h = x.hidden(), inter = x.intermediate();
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  constexpr unsigned kThreads = kWarpsPerBlock * kWarp;
  auto run = [&](auto vec8_tag, auto pairs_tag) {
    constexpr bool kVec8 = decltype(vec8_tag)::value;
    constexpr int kPairs = decltype(pairs_tag)::value;
    // k = 1: each row is its own "token", so a group's entry is the row itself.
    backend::cuda::launch_kernel(gate_up_rows<Matrix, kVec8, kPairs, Act>, warp_blocks(slots * inter), kThreads, 0,
                                 stream, rows.data<float>(), int64_t{1}, g, gw, uw, bias(x.gate_bias),
                                 bias(x.up_bias), h, inter, act, activated.data<float>());
    backend::cuda::launch_kernel(down_rows<Matrix, kVec8, kPairs>, warp_blocks(slots * h), kThreads, 0, stream,
                                 activated.data<float>(), g, dw, bias(x.down_bias), h, inter, out.data<float>());
  };
  auto by_pairs = [&](auto vec8_tag) {
    if (likely <= 1) run(vec8_tag, std::integral_constant<int, 1>{});
    else if (likely <= 2) run(vec8_tag, std::integral_constant<int, 2>{});
    else if (likely <= 4) run(vec8_tag, std::integral_constant<int, 4>{});
    else run(vec8_tag, std::integral_constant<int, kMaxPairsPerPass>{});
  };
  if (experts_detail::experts_vec8(x)) by_pairs(std::true_type{});
  else by_pairs(std::false_type{});
}

}  // namespace

void rows_through_their_experts_on_device(backend::Context& ctx, const Tensor& rows, const int32_t* ids,
                                          const DeviceExperts& experts, Tensor& out) {
  const int64_t n = rows.dim(0), h = experts.hidden(), inter = experts.intermediate(), count = experts.gate.dim(0);
  R3_CHECK(rows.rank() == 2 && rows.dim(1) == h && out.shape() == rows.shape(), "experts over ranks (cuda): rows ",
           shape_to_string(rows.shape()), ", out ", shape_to_string(out.shape()), " for experts of ", h);
  R3_CHECK(count <= 4096, "experts (cuda): ", count, " experts (at most 4096)");
  if (n == 0) return;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor grouping = ctx.scratch_for_output(DType::I32, {grouping_ints(count, n)});
  Tensor activated = ctx.scratch_for_output(DType::F32, {n, inter});
  int32_t* gp = grouping.data<int32_t>();
  const Grouping g{gp, gp + count + 1, gp + count + 1 + n, gp + 2 * count + 1 + n};
  const cudaStream_t stream = ctx.cuda_state().stream;
  // Each row is its own "token" (k = 1): a group's entry is the row itself.
  backend::cuda::launch_kernel(group_pairs_by_expert, 1, 1024, 2 * count * sizeof(int32_t), stream, ids,
                               experts.first, n, count, gp, gp + count + 1, gp + count + 1 + n, gp + 2 * count + 1 + n);
  const int64_t slots = std::min(count, n);
  const int64_t likely = std::min<int64_t>(kMaxPairsPerPass, std::max<int64_t>(1, 2 * ((n + count - 1) / count)));
  experts_detail::with_expert_matrices(experts, [&](auto gate, auto up, auto down) {
    experts_detail::with_activation(experts.activation, [&](auto act) {
      launch_grouped_rows(stream, rows, g, slots, likely, experts, act, gate, up, down, activated, out);
    });
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

void fused_experts_of_ids(backend::Context& ctx, const Tensor& hidden, const int32_t* ids, const float* weights,
                          int64_t k, const DeviceExperts& experts, Tensor& grouping, Tensor& activated,
                          Tensor& expert_out, Tensor& out, bool always_grouped) {
  const Tensor& g = experts.gate;
  const int64_t h = experts.hidden(), inter = experts.intermediate();
  R3_CHECK(hidden.rank() == 2 && g.rank() == 3 && experts.up.shape() == g.shape() && experts.down.rank() == 3 &&
               experts.down.dim(0) == g.dim(0) && experts.down.dim(1) == h && value_shape(experts.down)[2] == inter &&
               hidden.dim(1) == h && out.shape() == hidden.shape() && g.dtype() == experts.up.dtype() &&
               g.dtype() == experts.down.dtype(),
           "experts (cuda): hidden ", shape_to_string(hidden.shape()), ", gate ", shape_to_string(g.shape()), ", down ",
           shape_to_string(experts.down.shape()));
  const int64_t tokens = hidden.dim(0), pairs = tokens * k;
  R3_CHECK(activated.numel() >= expert_scratch_rows(pairs) * inter &&
               expert_out.numel() >= expert_scratch_rows(pairs) * h &&
               grouping.dtype() == DType::I32 && grouping.numel() >= grouping_ints(g.dim(0), pairs),
           "experts (cuda): scratch too small for ", pairs, " pairs");
  R3_CHECK(g.dim(0) <= 4096, "experts (cuda): ", g.dim(0), " experts (at most 4096)");
  if (tokens == 0) return;
  experts_detail::with_expert_matrices(experts, [&](auto gate, auto up, auto down) {
    experts_detail::with_activation(experts.activation, [&](auto act) {
      launch(ctx, hidden, ids, weights, k, experts, act, gate, up, down, grouping, activated, expert_out, out,
             always_grouped);
    });
  });
}

void fused_experts_on_device(backend::Context& ctx, const Tensor& hidden, const DevicePhysicalRouting& routing,
                             const DeviceExperts& experts, Tensor& grouping, Tensor& activated, Tensor& expert_out,
                             Tensor& out, bool always_grouped) {
  R3_CHECK(routing.tokens() == hidden.dim(0), "experts (cuda): a routing of ", routing.tokens(), " tokens for ",
           hidden.dim(0), " rows");
  fused_experts_of_ids(ctx, hidden, routing.ids(), routing.weights(), routing.k(), experts, grouping, activated,
                       expert_out, out, always_grouped);
}

}  // namespace r3::moe
