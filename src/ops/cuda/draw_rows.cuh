// The token draws' device pieces (ops/cuda/token_drawer.h), shared by the two ways a step's rows
// are drawn: one block of 1024 threads per row (sm90_draw_tokens.cu: every rule), and, for a few
// rows drawn without top-k, top-p, min-p or top-n logprobs, the same arithmetic spread over the
// whole GPU (sm90_draw_tokens_split.cu). Every sum runs in the order the 1024-thread block fixes
// (thread-strided or warp-segment partial sums, each warp's tree, then the warps in order), so both
// give the same bits. Internal to ops/cuda.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace r3::ops::cuda::draw_detail {

constexpr int kThreads = 1024;  // the block a row's arithmetic is laid out for
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxTop = 1024;  // the engine's limit on logprobs

struct DrawParams {
  double temperature, top_p, min_p, uniform;
  int32_t top_k, logprobs, draws, pad;
};

struct DrawResult {
  int32_t token;
  float logprob;
  int32_t nonfinite_token;
  float nonfinite_value;
  int32_t top_count, pad;
};

struct TopEntry {
  int32_t token;
  float logprob;
};

// A float's bits as an unsigned key with the float's order; -0 counts as +0 (the host's sort
// treats them as equal, so their order is by id).
__device__ inline uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(__fadd_rn(v, 0.0f));
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Warp w's share of a row walked in id order: [w * segment, (w + 1) * segment), whole rounds of 32.
__device__ inline int32_t segment_of(int32_t vocab) { return (vocab + kThreads - 1) / kThreads * kWarp; }

__device__ inline unsigned long long warp_sum(unsigned long long v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The token's weight at the row's temperature, as choose_token's: exp((logit - max) / T) in double.
__device__ inline double weight_of(float logit, float max_logit, double temperature) {
  return exp(__ddiv_rn(static_cast<double>(__fsub_rn(logit, max_logit)), temperature));
}

// log_softmax's term of a token: exp(logit - max) in double.
__device__ inline double z_term_of(float logit, float max_logit) {
  return exp(static_cast<double>(logit) - static_cast<double>(max_logit));
}

// One warp's part of the row's first pass: the largest logit (lowest id on ties) and the first
// non-finite one among the tokens of the warp's threads (thread t: t, t + 1024, ...).
struct WarpMax {
  uint32_t key;       // 0: the warp saw no finite logit
  int32_t best;       // INT_MAX: none
  int32_t nonfinite;  // INT_MAX: none
};
// Called by every lane of warp `warp` (of the row's 32).
__device__ inline WarpMax warp_max_of(const float* x, int32_t vocab, int warp, int lane) {
  uint32_t best_key = 0;
  int32_t best = INT_MAX, nonfinite = INT_MAX;
  for (int32_t i = warp * kWarp + lane; i < vocab; i += kThreads) {
    const float v = x[i];
    if (!isfinite(v)) {
      nonfinite = min(nonfinite, i);
      continue;
    }
    const uint32_t k = order_key(v);
    if (best == INT_MAX || k > best_key) best_key = k, best = i;
  }
  nonfinite = static_cast<int32_t>(__reduce_min_sync(0xffffffffu, static_cast<uint32_t>(nonfinite)));
  const uint32_t warp_key = __reduce_max_sync(0xffffffffu, best_key);
  best = static_cast<int32_t>(__reduce_min_sync(0xffffffffu, best_key == warp_key ? static_cast<uint32_t>(best) : UINT_MAX));
  return {warp_key, best, nonfinite};
}

// The row's largest logit and first non-finite one from its warps' parts, taken in warp order.
struct RowMax {
  int32_t argmax;     // INT_MAX: no finite logit
  int32_t nonfinite;  // INT_MAX: none
};
__device__ inline RowMax row_max_of(const WarpMax* warps) {
  uint32_t max_key = 0;
  RowMax m{INT_MAX, INT_MAX};
  for (int w = 0; w < kWarps; ++w) {
    m.nonfinite = min(m.nonfinite, warps[w].nonfinite);
    const int32_t candidate = warps[w].best;
    if (candidate == INT_MAX) continue;
    if (m.argmax == INT_MAX || warps[w].key > max_key || (warps[w].key == max_key && candidate < m.argmax)) {
      max_key = warps[w].key, m.argmax = candidate;
    }
  }
  return m;
}

// One round of a warp's walk: the inclusive prefix sums of the lanes' weights in double (the
// draw compares the running total plus each to its target).
__device__ inline double round_prefix(double w, int lane) {
  double inclusive = w;
  for (int o = 1; o < kWarp; o *= 2) {
    const double up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive = __dadd_rn(up, inclusive);
  }
  return inclusive;
}

// The draw's totals, the same on every thread of the row's block: each warp's segment [begin, end)
// summed in id order (lane-strided partial sums, then the warp's tree) with its last token of
// weight > 0, then across the warps in order the weight before this warp's segment, the row's
// total and its last kept token. weight(i): token i's kept weight. warp_d, warp_i: [kWarps] of
// shared memory. Every thread of the block calls it.
struct DrawTotals {
  double before, total;
  int32_t last_kept;
};
template <typename Weight>
__device__ DrawTotals draw_totals(Weight weight, int32_t begin, int32_t end, int warp, int lane, double* warp_d,
                                  int32_t* warp_i) {
  double mine = 0;
  int32_t last = -1;
  for (int32_t i = begin + lane; i < end; i += kWarp) {
    const double w = weight(i);
    mine = __dadd_rn(mine, w);
    if (w > 0) last = i;
  }
  mine = warp_sum(mine);
  last = static_cast<int32_t>(__reduce_max_sync(0xffffffffu, static_cast<uint32_t>(last + 1))) - 1;
  if (lane == 0) warp_d[warp] = mine, warp_i[warp] = last;
  __syncthreads();
  DrawTotals t{0, 0, -1};
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) t.before = __dadd_rn(t.before, warp_d[w]);
    t.total = __dadd_rn(t.total, warp_d[w]);
    t.last_kept = max(t.last_kept, warp_i[w]);
  }
  return t;
}

// The drawn token: the lowest of the warps' `chosen` (INT_MAX: none in the warp), else the last
// kept token (rounding left the target unreached). warp_i: [kWarps] of shared memory, which the
// caller may reuse once every thread has returned (it then synchronises first).
__device__ inline int32_t drawn_token(int32_t chosen, int32_t last_kept, int warp, int lane, int32_t* warp_i) {
  __syncthreads();
  if (lane == 0) warp_i[warp] = chosen;
  __syncthreads();
  int32_t token = INT_MAX;
  for (int w = 0; w < kWarps; ++w) token = min(token, warp_i[w]);
  return token == INT_MAX ? last_kept : token;
}

// The rows drawn spread over the GPU (sm90_draw_tokens_split.cu): rows <= kSplitRows, each
// drawing (or not) without top-k, top-p, min-p or top-n logprobs (split_draw_fits). `scratch`
// holds split_scratch_bytes(rows, vocab) bytes of device memory (the rows' weights in double:
// 19 MB at 16 rows of Qwen3's vocabulary, twice that with Z summed apart). Queued on `stream`.
constexpr int64_t kSplitRows = 16;
inline bool split_draw_fits(const DrawParams& p) {
  return p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0 && p.logprobs <= 0;
}
int64_t split_scratch_bytes(int64_t rows, int64_t vocab);
void launch_split_draws(const float* logits, int64_t rows, int32_t vocab, const DrawParams* params, DrawResult* results,
                        void* scratch, cudaStream_t stream);

}  // namespace r3::ops::cuda::draw_detail
