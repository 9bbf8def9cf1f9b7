// The inner loop of r3's weight-streaming kernels (the fused experts, the dense GEMV): one warp
// reads a weight row once and takes its dot products with several activation rows, keeping one
// partial sum per row in registers; lanes take every 32nd element (or every 32nd group of eight
// with wide loads) and the caller adds the lanes' sums with shuffles. Weight rows are those of
// weight_rows.cuh (float32, bfloat16, FP8 or MXFP4, decoded exactly in registers); activations
// and sums are float32.
#pragma once

#include <cstdint>

#include "ops/cuda/weight_rows.cuh"

namespace r3::ops::cuda {

constexpr int kWarp = 32;

// Eight consecutive float32 activations (32-byte aligned): two 128-bit loads. Coherent loads
// (__ldca, cached in L1), never the non-coherent path a `const __restrict__` pointer may give:
// the activations are the previous kernel's output, and a kernel released early by it
// (programmatic launch) is already running while it writes them. PTX defines non-coherent
// loads only for data nothing writes while the kernel runs (bench/RESULTS.md).
__device__ inline void load8(const float* p, float* out) {
  const float4 a = __ldca(reinterpret_cast<const float4*>(p)), b = __ldca(reinterpret_cast<const float4*>(p + 4));
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// A lane's raw loads of one round of the wide loop: kGroups groups of eight of each row
// (kGroupsInFlight unless a kernel asks for fewer, to hold fewer registers).
template <typename Row, int kRows, int kGroups = kGroupsInFlight<Row>>
using RoundOf = Raw8<Row>[kRows][kGroups];

// One round of the wide loop: the loads of a lane's groups from `base` (elements base + u * 256),
// then their products with the activation rows.
template <typename Row, int kRows, int kGroups>
__device__ inline void load_round(const Row (&w)[kRows], int64_t base, int64_t n, Raw8<Row> (&raw)[kRows][kGroups]) {
  constexpr int64_t kStride = kWarp * 8;
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (base + u * kStride < n) load_raw8(w[r], base + u * kStride, raw[r][u]);
    }
  }
}
// How use_round decodes a group: each row's own widen8 (WidenByRow), or for FP8 rows whose
// scales the lanes hold, one each, a shuffle for the scale (Fp8LaneScales).
struct WidenByRow {
  template <typename Row>
  __device__ void operator()(const Row& row, int, int64_t c, const Raw8<Row>& raw, float* out) const {
    widen8(row, c, raw, out);
  }
};
template <int kRows>
struct Fp8LaneScales {
  float scale[kRows];  // lane b: scale block first_block + b of row r
  int first_block;
  __device__ void operator()(const Fp8Row& row, int r, int64_t c, const Raw8<Fp8Row>& raw, float* out) const {
    const int block = static_cast<int>(static_cast<uint32_t>(c) >> row.block_cols_shift) - first_block;
    widen8_scaled(raw, __shfl_sync(0xffffffffu, scale[r], block), out);
  }
};

// Whether FP8 rows read over [begin, n) eight values at a time may take their scales from the
// lanes: begin on a block boundary, n - begin a multiple of 256 (every lane then takes the same
// rounds and groups, as the shuffles need) and at most 32 blocks (one a lane).
__host__ __device__ inline bool fp8_lane_scales_fit(int64_t begin, int64_t n, int64_t block_cols) {
  return block_cols > 0 && begin % block_cols == 0 && (n - begin) % 256 == 0 && n - begin <= 32 * block_cols;
}
// The lanes' scales of rows w over [begin, n) (fp8_lane_scales_fit): lane b loads block
// begin / block_cols + b of each row. Scales are weights, so a kernel may load them before its wait.
template <int kRows>
__device__ inline Fp8LaneScales<kRows> fp8_lane_scales(const Fp8Row (&w)[kRows], int64_t begin, int64_t n, int lane) {
  Fp8LaneScales<kRows> lanes;
  lanes.first_block = static_cast<int>(static_cast<uint32_t>(begin) >> w[0].block_cols_shift);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const bool in = (static_cast<int64_t>(lanes.first_block + lane) << w[r].block_cols_shift) < n;
    lanes.scale[r] = in ? w[r].scales[lanes.first_block + lane] : 0.0f;
  }
  return lanes;
}

template <typename Row, int kMax, int kRows, int kGroups, typename Widen = WidenByRow>
__device__ inline void use_round(const Row (&w)[kRows], const float* const (&x)[kMax], int count, int64_t base,
                                 int64_t n, const Raw8<Row> (&raw)[kRows][kGroups], float (&acc)[kRows][kMax],
                                 const Widen& widen = {}) {
  constexpr int64_t kStride = kWarp * 8;
#pragma unroll
  for (int u = 0; u < kGroups; ++u) {
    const int64_t c = base + u * kStride;
    if (c >= n) break;
    float wv[kRows][8];
#pragma unroll
    for (int r = 0; r < kRows; ++r) widen(w[r], r, c, raw[r][u], wv[r]);
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      if (j < count) {
        float xv[8];
        load8(x[j] + c, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][j] += xv[i] * wv[r][i];
        }
      }
    }
  }
}

// The wide loop (row_dots with kVec8) in two parts, for a kernel that issues its first weight
// loads before it waits for its predecessor (backend/cuda/launch.cuh): first_round_loads, then,
// after the wait, row_dots_after_first_round, which uses them and runs the remaining rounds. The
// same sums, in the same order, as row_dots.
template <typename Row, int kRows>
__device__ inline void first_round_loads(const Row (&w)[kRows], int64_t n, int lane,
                                         Raw8<Row> (&first)[kRows][kGroupsInFlight<Row>], int64_t begin = 0) {
  load_round(w, begin + static_cast<int64_t>(lane) * 8, n, first);
}
template <typename Row, int kMax, int kRows, typename Widen = WidenByRow>
__device__ inline void row_dots_after_first_round(const Row (&w)[kRows], const float* const (&x)[kMax], int count,
                                                  int64_t n, int lane,
                                                  const Raw8<Row> (&first)[kRows][kGroupsInFlight<Row>],
                                                  float (&acc)[kRows][kMax], int64_t begin = 0,
                                                  const Widen& widen = {}) {
  constexpr int64_t kRound = kWarp * 8 * kGroupsInFlight<Row>;
  const int64_t base = begin + static_cast<int64_t>(lane) * 8;
  if (base < n) use_round(w, x, count, base, n, first, acc, widen);
  for (int64_t next = base + kRound; next < n; next += kRound) {
    RoundOf<Row, kRows> raw;
    load_round(w, next, n, raw);
    use_round(w, x, count, next, n, raw, acc, widen);
  }
}

// The dot products of kRows weight rows w[r][0, n) with the rows x[j][0, n), j < count, into this
// lane's partial sums acc[r][j]: element by element, or eight at a time with wide loads (kVec8:
// n a multiple of 8, the rows aligned for the loads, FP8 blocks a power of two of at least 8 wide; see
// weights_vec8). Several weight rows (a gated MLP's gate and up rows) share the activation loads and have their loads in flight together.
// Each lane adds its elements in increasing order, whatever the unrolling, so the sums do not
// depend on it.
// Elements [begin, n) only when begin is given (a slice of the rows; with kVec8, begin a multiple
// of 8). With kVec8, `widen` decodes the groups: for FP8 rows whose scales fit the lanes
// (fp8_lane_scales_fit), fp8_lane_scales(w, begin, n, lane), a load a lane instead of a load a
// group held in a register until it arrives (a gate/up pair's 16 loads: 92 registers -> 80); the
// same products and sums either way.
// kGroups: groups of eight a lane has in flight a row (fewer than kGroupsInFlight: fewer registers,
// more rounds; the same sums).
template <bool kVec8, typename Row, int kMax, int kRows = 1, typename Widen = WidenByRow,
          int kGroups = kGroupsInFlight<Row>>
__device__ inline void row_dots(const Row (&w)[kRows], const float* const (&x)[kMax], int count, int64_t n,
                                int lane, float (&acc)[kRows][kMax], int64_t begin = 0, const Widen& widen = {}) {
  if constexpr (kVec8) {
    constexpr int64_t kRound = kWarp * 8 * kGroups;
    for (int64_t base = begin + static_cast<int64_t>(lane) * 8; base < n; base += kRound) {
      RoundOf<Row, kRows, kGroups> raw;
      load_round(w, base, n, raw);
      use_round(w, x, count, base, n, raw, acc, widen);
    }
  } else {
    for (int64_t c = begin + lane; c < n; c += kWarp) {
      float wv[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r] = load(w[r], c);
#pragma unroll
      for (int j = 0; j < kMax; ++j) {
        if (j < count) {
          const float xv = x[j][c];
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[r][j] += xv * wv[r];
        }
      }
    }
  }
}

// The sum of v over the warp's lanes, in every lane.
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace r3::ops::cuda
