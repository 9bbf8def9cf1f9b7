// Down + combine at one token with a block's rows all in flight before it waits for gate/up.
// Internal to moe/cuda (sm90_fused_experts.cu chooses it).
//
// The kernel it stands beside, down_and_combine_token_row, gives each hidden row a block: at
// Qwen3-30B-A3B's shape that is 2048 blocks of 768-byte FP8 rows, 2.6 waves of one short trip to
// memory each, with only the first wave's rows loaded under gate/up. Here a block takes kRows
// consecutive hidden rows; its warp j takes choice j's down rows for all of them and issues every
// load of those rows (kRows x kGroups groups of eight a lane) before its wait. The ids come from the
// routing before gate/up and the weights are no kernel's output, so the whole matrix slice is on
// its way while gate/up finishes: 256 blocks of 8 rows hold every FP8 down row of a token's 8
// experts in registers at once (about 95 KB an SM of the register file's 256 KB). After the wait a
// lane loads its activations once, the same for every row, and the rows' products follow.
//
// The same bits as down_and_combine_token_row: each lane adds its groups in increasing order with
// the same products (row_dots' use_round), the lanes meet by warp_sum, the bias is added, and the
// choices' results are summed in choice order as weight x output.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "ops/cuda/warp_row_dots.cuh"

namespace r3::moe::experts_detail {

// Warps a block has at most: one a choice.
constexpr int kDownChoiceWarps = 8;

// Whether the kernel takes a step: a choice a warp, every lane's groups of eight in registers
// (inter at most kGroups x 256 with kGroups <= 4), whole blocks of rows (h a multiple of 8, as
// reading rows eight values at a time needs anyway).
inline bool down_rows_in_flight_fit(int64_t k, int64_t h, int64_t inter) {
  return k >= 1 && k <= kDownChoiceWarps && inter >= 1 && inter <= 4 * 256 && h % 8 == 0;
}

// kLaneScales: FP8 rows whose scales fit the lanes over inter (ops::cuda::fp8_lane_scales_fit),
// each row's scales loaded a lane each with its values. Otherwise rows decode with their own widen8
// (bfloat16; FP8 scales then come from a load a group, after the wait).
// kRows: hidden rows a block takes, held to kMinBlocks blocks an SM. FP8 rows fit eight in
// registers at two blocks an SM (48 of a lane's registers at an expert width of 768); bfloat16
// rows, twice as wide, four at two. Launch: h / kRows blocks of k warps.
template <typename Matrix, int kRows, int kMinBlocks, int kGroups, bool kLaneScales>
__global__ void __launch_bounds__(kDownChoiceWarps* ops::cuda::kWarp, kMinBlocks)
    down_and_combine_rows_in_flight(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                                    const float* __restrict__ weights, int64_t k, Matrix down,
                                    const float* __restrict__ down_bias, int64_t h, int64_t inter,
                                    float* __restrict__ out) {
  using ops::cuda::kWarp;
  using Row = decltype(ops::cuda::row_of(down, 0));
  constexpr int64_t kStride = kWarp * 8;
  __shared__ float choice_out[kRows][kDownChoiceWarps];
  __shared__ float choice_weight[kDownChoiceWarps];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int j = static_cast<int>(threadIdx.x) / kWarp;  // this warp's choice (blockDim: k warps)
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t expert = ids[j];  // the routing's, before gate/up: ready before the wait
  Row w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w[r] = ops::cuda::row_of(down, expert * h + first_row + r);
  ops::cuda::Raw8<Row> raw[kRows][kGroups];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      const int64_t c = lane * 8 + u * kStride;
      if (c < inter) ops::cuda::load_raw8(w[r], c, raw[r][u]);
    }
  }
  using Widen = std::conditional_t<kLaneScales, ops::cuda::Fp8LaneScales<kRows>, ops::cuda::WidenByRow>;
  Widen widen{};
  if constexpr (kLaneScales) widen = ops::cuda::fp8_lane_scales(w, 0, inter, lane);
  if (lane == 0) choice_weight[j] = weights[j];
  backend::cuda::wait_for_predecessor();

  // This lane's activations of its choice: the same elements for every row. gate/up wrote them
  // while this kernel was already running (it was released early), so they are read coherently
  // from L2 (ld.global.cg), not through the non-coherent path that `const __restrict__` lets the
  // compiler choose: that path is only defined for data no one writes during the kernel.
  float a[kGroups][8];
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const int64_t c = lane * 8 + u * kStride;
    if (c < inter) {
      const float4 lo = __ldcg(reinterpret_cast<const float4*>(activated + j * inter + c));
      const float4 hi = __ldcg(reinterpret_cast<const float4*>(activated + j * inter + c + 4));
      a[u][0] = lo.x; a[u][1] = lo.y; a[u][2] = lo.z; a[u][3] = lo.w;
      a[u][4] = hi.x; a[u][5] = hi.y; a[u][6] = hi.z; a[u][7] = hi.w;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      const int64_t c = lane * 8 + u * kStride;
      if (c >= inter) break;
      float wv[8];
      widen(w[r], r, c, raw[r][u], wv);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += a[u][i] * wv[i];
    }
    const float y = ops::cuda::warp_sum(acc);
    if (lane == 0) choice_out[r][j] = down_bias ? y + down_bias[expert * h + first_row + r] : y;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = static_cast<int>(threadIdx.x);
    float sum = 0.0f;
    for (int64_t c = 0; c < k; ++c) sum = __fadd_rn(sum, __fmul_rn(choice_weight[c], choice_out[r][c]));
    out[first_row + r] = sum;
  }
}

}  // namespace r3::moe::experts_detail
