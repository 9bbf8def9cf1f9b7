// A few rows' draws without top-k, top-p, min-p or top-n logprobs (ops/cuda/draw_rows.cuh), spread
// over the GPU. The one-block kernel spends its time in ~150k double exps per row, and the walk of
// the chosen warp's segment (one exp and one prefix sum per round of 32 tokens, one round after
// the other); with one row that is one SM working. Here, with the one-block kernel's arithmetic
// and order:
//   1. row_maxima: each of the row's 32 warps' first pass (largest logit, first non-finite), a
//      block of one warp each;
//   2. row_weights: every token's weight exp((logit - max) / T), and its log_softmax term when
//      Z is summed apart, stored in double; and per round of 32 tokens of each warp's segment,
//      the round's total (its last inclusive prefix) and its reach (the largest inclusive prefix
//      of a token with weight > 0, -1 if none): a warp per round, every round at once;
//   3. row_draws: a block of 1024 threads per row sums the stored terms in the one-block kernel's
//      orders, and each warp whose segment may hold the draw walks its rounds by their totals,
//      opening only the round whose reach passes the target (where the one-block kernel's lanes
//      would first see a token over it: rounding is monotone, so a token is over exactly when the
//      largest prefix is).
#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/draw_rows.cuh"

namespace r3::ops::cuda::draw_detail {

namespace {

// Where a row's stored pieces are in the scratch.
struct SplitScratch {
  WarpMax* maxima;  // [rows, kWarps]
  double* weights;  // [rows, vocab]
  double* z_terms;  // [rows, vocab]
  double* totals;   // [rows, kWarps, rounds]
  double* reaches;  // [rows, kWarps, rounds]
  int32_t vocab, rounds;
};

constexpr std::size_t align_up(std::size_t n) { return (n + 255) / 256 * 256; }

SplitScratch carve(void* base, int64_t rows, int32_t vocab) {
  const int32_t rounds = (vocab + kThreads - 1) / kThreads;  // a warp segment's rounds of 32
  auto* at = static_cast<char*>(base);
  SplitScratch s{};
  s.vocab = vocab;
  s.rounds = rounds;
  s.maxima = reinterpret_cast<WarpMax*>(at);
  at += align_up(static_cast<std::size_t>(rows * kWarps) * sizeof(WarpMax));
  s.weights = reinterpret_cast<double*>(at);
  at += align_up(static_cast<std::size_t>(rows * vocab) * sizeof(double));
  s.z_terms = reinterpret_cast<double*>(at);
  at += align_up(static_cast<std::size_t>(rows * vocab) * sizeof(double));
  s.totals = reinterpret_cast<double*>(at);
  at += align_up(static_cast<std::size_t>(rows * kWarps * rounds) * sizeof(double));
  s.reaches = reinterpret_cast<double*>(at);
  return s;
}

// The one-block kernel's choices about Z: summed apart from the draw's weights (logprobs asked
// and not the draw's own total, which it is at temperature 1 with nothing cut).
__device__ inline bool z_apart(const DrawParams& p) { return p.logprobs >= 0 && !(p.temperature == 1.0); }

// 1. Block (row, warp), one warp.
__global__ void row_maxima(const float* __restrict__ logits, int32_t vocab, const DrawParams* __restrict__ params,
                           SplitScratch s) {
  backend::cuda::wait_for_predecessor();
  const int64_t row = blockIdx.x / kWarps;
  const int warp = static_cast<int>(blockIdx.x % kWarps), lane = static_cast<int>(threadIdx.x);
  if (!params[row].draws) return;
  const WarpMax m = warp_max_of(logits + row * static_cast<int64_t>(vocab), vocab, warp, lane);
  if (lane == 0) s.maxima[row * kWarps + warp] = m;
}

// 2. One warp per (row, warp segment, round); blocks of kRoundWarps warps.
constexpr int kRoundWarps = 8;
__global__ void __launch_bounds__(kRoundWarps* kWarp) row_weights(const float* __restrict__ logits, int64_t rows,
                                                                   const DrawParams* __restrict__ params, SplitScratch s) {
  backend::cuda::wait_for_predecessor();
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kRoundWarps + threadIdx.x / kWarp;
  const int64_t per_row = static_cast<int64_t>(kWarps) * s.rounds;
  if (task >= rows * per_row) return;
  const int64_t row = task / per_row;
  const auto warp = static_cast<int32_t>(task % per_row / s.rounds), round = static_cast<int32_t>(task % s.rounds);
  const DrawParams p = params[row];
  if (!p.draws) return;
  const RowMax m = row_max_of(s.maxima + row * kWarps);
  if (m.nonfinite != INT_MAX) return;  // the row is not drawn from
  const float* x = logits + row * static_cast<int64_t>(s.vocab);
  const float max_logit = x[m.argmax];
  const int32_t segment = segment_of(s.vocab), begin = warp * segment, end = min(s.vocab, begin + segment);
  const int32_t i = begin + round * kWarp + lane;
  if (z_apart(p) && i < end) s.z_terms[row * s.vocab + i] = z_term_of(x[i], max_logit);
  if (!(p.temperature > 0)) return;
  const double w = i < end ? weight_of(x[i], max_logit, p.temperature) : 0.0;
  if (i < end) s.weights[row * s.vocab + i] = w;
  const double inclusive = round_prefix(w, lane);
  double reach = w > 0 ? inclusive : -1.0;
  for (int o = kWarp / 2; o > 0; o /= 2) reach = fmax(reach, __shfl_xor_sync(0xffffffffu, reach, o));
  const double total = __shfl_sync(0xffffffffu, inclusive, kWarp - 1);
  if (lane == 0) {
    const int64_t at = (row * kWarps + warp) * s.rounds + round;
    s.totals[at] = total;
    s.reaches[at] = reach;
  }
}

struct Shared {
  double warp_d[kWarps];
  int32_t warp_i[kWarps];
};

// 3. One block of kThreads per row.
__global__ void __launch_bounds__(kThreads) row_draws(const float* __restrict__ logits,
                                                      const DrawParams* __restrict__ params,
                                                      DrawResult* __restrict__ results, SplitScratch s) {
  backend::cuda::wait_for_predecessor();
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const DrawParams p = params[row];
  DrawResult result{-1, 0.0f, -1, 0.0f, 0, 0};
  if (!p.draws) {
    if (threadIdx.x == 0) results[row] = result;
    return;
  }
  const float* x = logits + row * static_cast<int64_t>(s.vocab);
  const int warp = static_cast<int>(threadIdx.x / kWarp), lane = static_cast<int>(threadIdx.x % kWarp);
  const RowMax m = row_max_of(s.maxima + row * kWarps);
  if (m.nonfinite != INT_MAX) {
    if (threadIdx.x == 0) {
      result.nonfinite_token = m.nonfinite;
      result.nonfinite_value = x[m.nonfinite];
      results[row] = result;
    }
    return;
  }
  const float max_logit = x[m.argmax];
  const double* weights = s.weights + row * s.vocab;
  const double* z_terms = s.z_terms + row * s.vocab;
  // The block's sum of per-thread partials: each warp's tree, then the warps in order.
  const auto block_sum = [&](double v) {
    v = warp_sum(v);
    if (lane == 0) sh.warp_d[warp] = v;
    __syncthreads();
    double total = 0;
    for (int w = 0; w < kWarps; ++w) total = __dadd_rn(total, sh.warp_d[w]);
    __syncthreads();
    return total;
  };
  double log_z = 0;
  if (z_apart(p)) {
    double z = 0;
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < s.vocab; i += kThreads) z += z_terms[i];
    log_z = log(block_sum(z));
  }
  int32_t token = m.argmax;
  if (p.temperature > 0) {
    const int32_t segment = segment_of(s.vocab), begin = warp * segment, end = min(s.vocab, begin + segment);
    const DrawTotals t = draw_totals([&](int32_t i) { return weights[i]; }, begin, end, warp, lane, sh.warp_d, sh.warp_i);
    if (p.logprobs >= 0 && !z_apart(p)) log_z = log(t.total);
    const double target = p.uniform * t.total;
    int32_t chosen = INT_MAX;
    if (t.before <= target && sh.warp_d[warp] > 0) {
      const double* totals = s.totals + (row * kWarps + warp) * s.rounds;
      const double* reaches = s.reaches + (row * kWarps + warp) * s.rounds;
      double running = t.before;
      for (int32_t r = 0; begin + r * kWarp < end; ++r) {
        if (reaches[r] > 0 && __dadd_rn(running, reaches[r]) > target) {
          const int32_t base = begin + r * kWarp, i = base + lane;
          const double w = i < end ? weights[i] : 0.0;
          const double inclusive = round_prefix(w, lane);
          const unsigned over = __ballot_sync(0xffffffffu, w > 0 && __dadd_rn(running, inclusive) > target);
          chosen = base + __ffs(over) - 1;
          break;
        }
        running = __dadd_rn(running, totals[r]);
      }
    }
    token = drawn_token(chosen, t.last_kept, warp, lane, sh.warp_i);
  }
  result.token = token;
  if (p.logprobs >= 0) result.logprob = static_cast<float>(static_cast<double>(x[token]) - static_cast<double>(max_logit) - log_z);
  if (threadIdx.x == 0) results[row] = result;
}

}  // namespace

int64_t split_scratch_bytes(int64_t rows, int64_t vocab) {
  const int64_t rounds = (vocab + kThreads - 1) / kThreads;
  return static_cast<int64_t>(align_up(static_cast<std::size_t>(rows * kWarps) * sizeof(WarpMax)) +
                              2 * align_up(static_cast<std::size_t>(rows * vocab) * sizeof(double)) +
                              2 * align_up(static_cast<std::size_t>(rows * kWarps * rounds) * sizeof(double)));
}

void launch_split_draws(const float* logits, int64_t rows, int32_t vocab, const DrawParams* params, DrawResult* results,
                        void* scratch, cudaStream_t stream) {
  const SplitScratch s = carve(scratch, rows, vocab);
  backend::cuda::launch_kernel(row_maxima, dim3(static_cast<unsigned>(rows * kWarps)), dim3(kWarp), 0, stream, logits,
                               vocab, params, s);
  const int64_t tasks = rows * kWarps * s.rounds;
  backend::cuda::launch_kernel(row_weights, dim3(static_cast<unsigned>((tasks + kRoundWarps - 1) / kRoundWarps)),
                               dim3(kRoundWarps * kWarp), 0, stream, logits, rows, params, s);
  backend::cuda::launch_kernel(row_draws, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, logits, params,
                               results, s);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda::draw_detail
