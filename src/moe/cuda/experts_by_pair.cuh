// The fused experts' work for decode steps of a few tokens, pair by pair (no grouping by expert),
// shared by the two-kernel way of sm90_fused_experts.cu and the monolithic MoE kernel
// (sm90_monolithic_moe.cu), so that both give the bits of the grouped kernels: every dot product, bias
// and sum is theirs, in the same order. Internal to moe/cuda.
#pragma once

#include <cstdint>

#include "ops/cuda/warp_row_dots.cuh"

namespace r3::moe::experts_detail {

// One warp: intermediate row i of pair p (token p / k, physical expert ids[p]), gate and up rows
// read together, into activated[p * inter + i] (lane 0 writes). kLaneScales: FP8 rows whose
// scales fit the lanes over h (ops::cuda::fp8_lane_scales_fit) take them from there, the same bits.
// kGroups > 0: that many groups of eight in flight a row instead of the row type's default (fewer
// registers a thread), the same bits.
template <bool kVec8, typename Matrix, typename Act, bool kLaneScales = false, int kGroups = 0>
__device__ inline void gate_up_pair_row(const float* __restrict__ hidden, const int32_t* __restrict__ ids, int64_t k,
                                        int64_t p, int64_t i, const Matrix& gate, const Matrix& up,
                                        const float* __restrict__ gate_bias, const float* __restrict__ up_bias,
                                        int64_t h, int64_t inter, const Act& act, float* __restrict__ activated,
                                        int lane) {
  using ops::cuda::row_of;
  const int64_t row = ids[p] * inter + i;
  const decltype(row_of(gate, 0)) gate_up[2] = {row_of(gate, row), row_of(up, row)};
  const float* const x[1] = {hidden + (p / k) * h};
  float acc[2][1] = {{0.0f}, {0.0f}};
  using Row = decltype(row_of(gate, 0));
  constexpr int kInFlight = kGroups > 0 ? kGroups : ops::cuda::kGroupsInFlight<Row>;
  if constexpr (kLaneScales) {
    ops::cuda::row_dots<kVec8, Row, 1, 2, ops::cuda::Fp8LaneScales<2>, kInFlight>(
        gate_up, x, 1, h, lane, acc, 0, ops::cuda::fp8_lane_scales(gate_up, 0, h, lane));
  } else {
    ops::cuda::row_dots<kVec8, Row, 1, 2, ops::cuda::WidenByRow, kInFlight>(gate_up, x, 1, h, lane, acc);
  }
  float gs = ops::cuda::warp_sum(acc[0][0]), us = ops::cuda::warp_sum(acc[1][0]);
  if (lane == 0) {
    if (gate_bias) gs += gate_bias[row];
    if (up_bias) us += up_bias[row];
    activated[p * inter + i] = act(gs, us);
  }
}

// One warp: hidden row d of token t over all k choices (each choice's down row . its activation,
// + bias), summed as weight x output in choice order into out[t * h + d] (lane 0 writes), as
// combine_choices does after the grouped kernels. The choices' dot products are issued four at a
// time before their sums, so their loads are in flight together.
template <bool kVec8, typename Matrix>
__device__ inline void down_and_combine_row_in_warp(const float* __restrict__ activated,
                                                    const int32_t* __restrict__ ids,
                                                    const float* __restrict__ weights, int64_t k,
                                                    const Matrix& down, const float* __restrict__ down_bias,
                                                    int64_t h, int64_t inter, int64_t t, int64_t d,
                                                    float* __restrict__ out, int lane) {
  using ops::cuda::row_of;
  constexpr int kChoices = 4;
  float sum = 0.0f;
  for (int64_t first = 0; first < k; first += kChoices) {
    float acc[kChoices][1][1];
#pragma unroll
    for (int c = 0; c < kChoices; ++c) {
      acc[c][0][0] = 0.0f;
      const int64_t j = first + c;
      if (j < k) {
        const int64_t p = t * k + j;
        const decltype(row_of(down, 0)) w[1] = {row_of(down, ids[p] * h + d)};
        const float* const a[1] = {activated + p * inter};
        ops::cuda::row_dots<kVec8>(w, a, 1, inter, lane, acc[c]);
      }
    }
#pragma unroll
    for (int c = 0; c < kChoices; ++c) {
      const int64_t j = first + c;
      if (j < k) {
        const float y = ops::cuda::warp_sum(acc[c][0][0]);
        const int64_t p = t * k + j;
        const float choice_out = down_bias ? y + down_bias[ids[p] * h + d] : y;
        sum = __fadd_rn(sum, __fmul_rn(weights[t * k + j], choice_out));
      }
    }
  }
  if (lane == 0) out[t * h + d] = sum;
}

}  // namespace r3::moe::experts_detail
