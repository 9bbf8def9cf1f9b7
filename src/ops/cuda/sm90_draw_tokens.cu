// Next-token draws from device logits (ops/cuda/token_drawer.h): one block of 1024 threads per
// row, in passes over the row (600 KB at Qwen3's vocabulary, mostly from L2 after the first):
//   1. the largest logit (lowest id on ties) and the first non-finite one;
//   2. with logprobs: Z = sum exp(logit - max) in double (log_softmax's);
//   3. top-k: the k-th token in (logit desc, id asc) order, by a radix select over the logits'
//      order-preserving 32-bit keys (four 8-bit histogram passes of counts, then the ties by id);
//   4. top-p: the same select over the kept tokens' weights in fixed point (w * 2^40, integers,
//      so the histogram's atomic adds give the same sums in any order);
//   5. the draw: the kept weight K in double, summed per warp segment then over the warps in
//      order, and the first kept token in id order whose running weight exceeds uniform * K;
//   6. top-n logprobs: the n-th token by the same select, its n tokens gathered and sorted.
// A step of a few rows without top-k, top-p, min-p or top-n logprobs (an RL rollout's draws) runs
// the same arithmetic spread over the GPU instead (sm90_draw_tokens_split.cu): one block per row
// leaves all but a few SMs idle while it computes 150k double exps.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/draw_rows.cuh"
#include "ops/cuda/token_drawer.h"

namespace r3::ops::cuda {

namespace {

using namespace draw_detail;

constexpr double kFixedPoint = 1099511627776.0;  // 2^40: weights <= 1, so a vocabulary < 2^23 sums below 2^63

// A prefix of the order (key desc, id asc): every token before or at (key, id).
struct Boundary {
  uint32_t key;
  int32_t id;
  __device__ bool holds(uint32_t k, int32_t i) const { return k > key || (k == key && i <= id); }
};

struct Shared {
  unsigned long long hist[256];
  unsigned long long warp_u[kWarps];
  double warp_d[kWarps];
  int32_t warp_i[kWarps];
  WarpMax warp_max[kWarps];
  unsigned long long above;
  Boundary found;
  int32_t count;
  TopEntry top[kMaxTop];
};

// The block's sum, the same on every thread: each warp's tree, then the warps in order.
__device__ unsigned long long block_sum(Shared& s, unsigned long long v) {
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0) s.warp_u[threadIdx.x / kWarp] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.warp_u[w];
  __syncthreads();
  return total;
}
__device__ double block_sum(Shared& s, double v) {
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0) s.warp_d[threadIdx.x / kWarp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total = __dadd_rn(total, s.warp_d[w]);
  __syncthreads();
  return total;
}

// The shortest prefix of the order (key desc, id asc) among the tokens `allowed` accepts whose
// total `measure` reaches `target` (> 0, at most the allowed total): four histogram passes
// over the key's bytes, high to low, then the tokens of the boundary key walked in id order (warp
// segments, then lanes). measure and allowed take (token, key).
template <typename Measure, typename Allowed>
__device__ Boundary select_prefix(Shared& s, const float* x, int32_t vocab, unsigned long long target, Measure measure,
                                  Allowed allowed) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;  // measure of the allowed tokens with keys above the candidates
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) s.hist[d] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t k = order_key(x[i]);
      if ((k & mask) != prefix || !allowed(i, k)) continue;
      const unsigned long long m = measure(i, k);
      if (m != 0) atomicAdd(&s.hist[(k >> shift) & 255u], m);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long acc = above;
      int d = 255;
      for (; d > 0 && acc + s.hist[d] < target; --d) acc += s.hist[d];
      s.above = acc;
      s.found.key = prefix | (static_cast<uint32_t>(d) << shift);
    }
    __syncthreads();
    above = s.above;
    prefix = s.found.key;
    mask |= 255u << shift;
    __syncthreads();
  }
  // The tokens holding the boundary key, in id order: warp w's segment, lane by lane.
  const int32_t segment = segment_of(vocab);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int32_t begin = warp * segment, end = min(vocab, begin + segment);
  unsigned long long mine = 0;
  for (int32_t i = begin + lane; i < end; i += kWarp) {
    const uint32_t k = order_key(x[i]);
    if (k == prefix && allowed(i, k)) mine += measure(i, k);
  }
  mine = warp_sum(mine);
  if (lane == 0) s.warp_u[warp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long acc = above;
    int w = 0;
    for (; w < kWarps - 1 && acc + s.warp_u[w] < target; ++w) acc += s.warp_u[w];
    s.above = acc;
    s.warp_i[0] = w;
  }
  __syncthreads();
  if (warp == s.warp_i[0]) {
    unsigned long long running = s.above;
    int32_t chosen = -1;
    for (int32_t base = begin; base < end && chosen < 0; base += kWarp) {
      const int32_t i = base + lane;
      unsigned long long m = 0;
      if (i < end) {
        const uint32_t k = order_key(x[i]);
        if (k == prefix && allowed(i, k)) m = measure(i, k);
      }
      unsigned long long inclusive = m;
      for (int o = 1; o < kWarp; o *= 2) {
        const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += up;
      }
      const bool reaches = m != 0 && running + inclusive >= target;
      const unsigned first = __ballot_sync(0xffffffffu, reaches);
      if (first != 0) chosen = base + __ffs(first) - 1;
      running += __shfl_sync(0xffffffffu, inclusive, kWarp - 1);
    }
    if (lane == 0) s.found.id = chosen < 0 ? INT_MAX : chosen;  // rounding cannot leave it unfound; keep all if so
  }
  __syncthreads();
  const Boundary b = s.found;
  __syncthreads();
  return b;
}

__global__ void __launch_bounds__(kThreads) draw_rows(const float* __restrict__ logits, int32_t vocab,
                                                      const DrawParams* __restrict__ params,
                                                      DrawResult* __restrict__ results, TopEntry* __restrict__ tops,
                                                      int32_t top_stride) {
  backend::cuda::wait_for_predecessor();
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  const DrawParams p = params[row];
  DrawResult result{-1, 0.0f, -1, 0.0f, 0, 0};
  if (!p.draws) {
    if (threadIdx.x == 0) results[row] = result;
    return;
  }
  const float* x = logits + row * static_cast<int64_t>(vocab);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  // 1. The largest logit (the lowest id holding it) and the first non-finite logit.
  const WarpMax mine_max = warp_max_of(x, vocab, warp, lane);
  if (lane == 0) s.warp_max[warp] = mine_max;
  __syncthreads();
  const RowMax row_max = row_max_of(s.warp_max);
  const int32_t argmax = row_max.argmax, nonfinite = row_max.nonfinite;
  __syncthreads();
  if (nonfinite != INT_MAX) {
    if (threadIdx.x == 0) {
      result.nonfinite_token = nonfinite;
      result.nonfinite_value = x[nonfinite];
      results[row] = result;
    }
    return;
  }
  const float max_logit = x[argmax];

  // 2. log Z of the raw distribution (log_softmax's sum, in double). A draw at temperature 1 with
  // no rule keeping fewer tokens weighs every token by exactly Z's term exp(logit - max), so its
  // total is Z: that pass (double exps, the kernel's costliest) is not made twice.
  const bool z_from_draw = p.temperature == 1.0 && p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0;
  double log_z = 0;
  if (p.logprobs >= 0 && !z_from_draw) {
    double z = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) z += z_term_of(x[i], max_logit);
    log_z = log(block_sum(s, z));
  }
  auto logprob_of = [&](int32_t i) {
    return static_cast<float>(static_cast<double>(x[i]) - static_cast<double>(max_logit) - log_z);
  };

  int32_t token = argmax;
  if (p.temperature > 0) {
    const double t = p.temperature;
    // 3. top-k.
    Boundary by_k{0, INT_MAX};  // key 0 is below every finite logit's: all tokens
    if (p.top_k > 0 && p.top_k < vocab) {
      by_k = select_prefix(
          s, x, vocab, static_cast<unsigned long long>(p.top_k), [](int32_t, uint32_t) { return 1ull; },
          [](int32_t, uint32_t) { return true; });
    }
    auto fixed = [&](int32_t i, uint32_t) { return static_cast<unsigned long long>(__double2ull_rn(weight_of(x[i], max_logit, t) * kFixedPoint)); };
    auto in_k = [&](int32_t i, uint32_t k) { return by_k.holds(k, i); };
    // 4. top-p over the top-k tokens.
    Boundary by_p{0, INT_MAX};
    if (p.top_p < 1.0) {
      unsigned long long total = 0;
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
        const uint32_t k = order_key(x[i]);
        if (in_k(i, k)) total += fixed(i, k);
      }
      total = block_sum(s, total);
      auto target = static_cast<unsigned long long>(ceil(p.top_p * static_cast<double>(total)));
      target = max(1ull, min(target, total));
      by_p = select_prefix(s, x, vocab, target, fixed, in_k);
    }
    // 5. The draw over the kept tokens (both prefixes, min-p) in id order.
    const int32_t segment = segment_of(vocab);
    const int32_t begin = warp * segment, end = min(vocab, begin + segment);
    auto kept_weight = [&](int32_t i) {
      const uint32_t k = order_key(x[i]);
      if (!by_k.holds(k, i) || !by_p.holds(k, i)) return 0.0;
      const double w = weight_of(x[i], max_logit, t);
      return w >= p.min_p ? w : 0.0;
    };
    const DrawTotals totals = draw_totals(kept_weight, begin, end, warp, lane, s.warp_d, s.warp_i);
    if (z_from_draw) log_z = log(totals.total);
    const double target = p.uniform * totals.total;
    int32_t chosen = INT_MAX;
    if (totals.before <= target && s.warp_d[warp] > 0) {
      double running = totals.before;
      for (int32_t base = begin; base < end && chosen == INT_MAX; base += kWarp) {
        const int32_t i = base + lane;
        const double w = i < end ? kept_weight(i) : 0.0;
        const double inclusive = round_prefix(w, lane);
        const unsigned over = __ballot_sync(0xffffffffu, w > 0 && __dadd_rn(running, inclusive) > target);
        if (over != 0) chosen = base + __ffs(over) - 1;
        running = __dadd_rn(running, __shfl_sync(0xffffffffu, inclusive, kWarp - 1));
      }
    }
    token = drawn_token(chosen, totals.last_kept, warp, lane, s.warp_i);
    __syncthreads();
  }
  result.token = token;
  if (p.logprobs >= 0) result.logprob = logprob_of(token);

  // 6. The n most likely tokens, highest logprob first, the lower id first on ties.
  if (p.logprobs > 0) {
    const int32_t n = min(p.logprobs, vocab);
    const Boundary by_n = select_prefix(
        s, x, vocab, static_cast<unsigned long long>(n), [](int32_t, uint32_t) { return 1ull; },
        [](int32_t, uint32_t) { return true; });
    int span = 1;  // the sort's length: a power of two
    while (span < n) span *= 2;
    if (threadIdx.x == 0) s.count = 0;
    for (int32_t i = threadIdx.x; i < span; i += kThreads) s.top[i] = {INT_MAX, -INFINITY};
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      if (by_n.holds(order_key(x[i]), i)) {
        const int slot = atomicAdd(&s.count, 1);
        if (slot < kMaxTop) s.top[slot] = {i, logprob_of(i)};
      }
    }
    __syncthreads();
    // Bitonic sort of the span's entries (empty ones last).
    auto before = [](const TopEntry& a, const TopEntry& b) {
      return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
    };
    for (int size = 2; size <= span; size *= 2) {
      for (int stride = size / 2; stride > 0; stride /= 2) {
        for (int i = threadIdx.x; i < span; i += kThreads) {
          const int j = i ^ stride;
          if (j > i) {
            const bool ascending = (i & size) == 0;
            const TopEntry a = s.top[i], b = s.top[j];
            if (ascending ? before(b, a) : before(a, b)) s.top[i] = b, s.top[j] = a;
          }
        }
        __syncthreads();
      }
    }
    for (int32_t i = threadIdx.x; i < n; i += kThreads) tops[row * top_stride + i] = s.top[i];
    result.top_count = n;
  }
  if (threadIdx.x == 0) results[row] = result;
}

// Host and device buffers: [rows] DrawParams, [rows] DrawResult, [rows, top] TopEntry.
std::size_t params_bytes(int64_t rows) { return static_cast<std::size_t>(rows) * sizeof(DrawParams); }
std::size_t results_bytes(int64_t rows) { return static_cast<std::size_t>(rows) * sizeof(DrawResult); }
std::size_t tops_bytes(int64_t rows, int64_t top) { return static_cast<std::size_t>(rows * top) * sizeof(TopEntry); }

}  // namespace

TokenDrawer::~TokenDrawer() {
  if (host_ != nullptr) cudaFreeHost(host_);
  if (device_ != nullptr) cudaFree(device_);
  if (spread_scratch_ != nullptr) cudaFree(spread_scratch_);
}

void TokenDrawer::reserve(backend::Context& ctx, int64_t rows, int64_t top) {
  if (rows <= rows_ && top <= top_) return;
  rows_ = std::max(rows_, rows);
  top_ = std::max(top_, top);
  if (host_ != nullptr) cudaFreeHost(host_);
  if (device_ != nullptr) cudaFree(device_);
  host_ = device_ = nullptr;
  const std::size_t bytes = params_bytes(rows_) + results_bytes(rows_) + tops_bytes(rows_, top_);
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  R3_CUDA_CHECK(cudaMallocHost(&host_, bytes));
  R3_CUDA_CHECK(cudaMalloc(&device_, bytes));
}

void TokenDrawer::draw(backend::Context& ctx, const Tensor& logits, std::span<const TokenDraw> draws,
                       std::span<DrawnToken> drawn) {
  R3_CHECK(logits.dtype() == DType::F32 && logits.rank() == 2 && logits.is_contiguous() &&
               logits.device() == Device::kCuda,
           "token draws (cuda): logits must be F32 [rows, vocab] on the device");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  R3_CHECK(static_cast<int64_t>(draws.size()) == rows && drawn.size() == draws.size(), "token draws (cuda): ",
           draws.size(), " draws and ", drawn.size(), " results for ", rows, " rows");
  R3_CHECK(vocab > 0 && vocab < (int64_t{1} << 23), "token draws (cuda): a vocabulary of ", vocab,
           " tokens (the fixed-point weights hold fewer than 2^23)");
  if (rows == 0) return;
  int64_t top = 0;
  for (const TokenDraw& d : draws) {
    R3_CHECK(d.logprobs <= kMaxTop, "token draws (cuda): ", d.logprobs, " top logprobs (at most ", kMaxTop, ")");
    if (d.draws) top = std::max(top, std::min(d.logprobs, vocab));
  }
  reserve(ctx, rows, std::max<int64_t>(top, 1));
  auto* host_params = static_cast<DrawParams*>(host_);
  for (int64_t r = 0; r < rows; ++r) {
    const TokenDraw& d = draws[static_cast<std::size_t>(r)];
    const int64_t top_k = d.top_k > 0 && d.top_k < vocab ? d.top_k : 0;
    host_params[r] = DrawParams{d.temperature, d.top_p, d.min_p, d.uniform, static_cast<int32_t>(top_k),
                                static_cast<int32_t>(d.logprobs), d.draws ? 1 : 0, 0};
  }
  auto* base = static_cast<char*>(device_);
  auto* device_params = reinterpret_cast<DrawParams*>(base);
  auto* device_results = reinterpret_cast<DrawResult*>(base + params_bytes(rows_));
  auto* device_tops = reinterpret_cast<TopEntry*>(base + params_bytes(rows_) + results_bytes(rows_));
  const cudaStream_t stream = ctx.cuda_state().stream;
  R3_CUDA_CHECK(cudaMemcpyAsync(device_params, host_params, params_bytes(rows), cudaMemcpyHostToDevice, stream));
  const auto stride = static_cast<int32_t>(std::max<int64_t>(top, 1));
  bool spread = spread_few_rows_ && rows <= kSplitRows;
  for (int64_t r = 0; r < rows && spread; ++r) spread = !host_params[r].draws || split_draw_fits(host_params[r]);
  if (spread) {
    // Sized for the most rows that spread, once per vocabulary.
    const int64_t bytes = split_scratch_bytes(kSplitRows, vocab);
    if (bytes > spread_bytes_) {
      if (spread_scratch_ != nullptr) R3_CUDA_CHECK(cudaFree(spread_scratch_));
      spread_scratch_ = nullptr;
      R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
      R3_CUDA_CHECK(cudaMalloc(&spread_scratch_, static_cast<std::size_t>(bytes)));
      spread_bytes_ = bytes;
    }
    launch_split_draws(logits.data<float>(), rows, static_cast<int32_t>(vocab), device_params, device_results,
                       spread_scratch_, stream);
    ++spread_steps_;
  } else {
    backend::cuda::launch_kernel(draw_rows, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream,
                                 logits.data<float>(), static_cast<int32_t>(vocab), device_params, device_results,
                                 device_tops, stride);
  }
  auto* host_base = static_cast<char*>(host_);
  auto* host_results = reinterpret_cast<DrawResult*>(host_base + params_bytes(rows_));
  auto* host_tops = reinterpret_cast<TopEntry*>(host_base + params_bytes(rows_) + results_bytes(rows_));
  R3_CUDA_CHECK(cudaMemcpyAsync(host_results, device_results, results_bytes(rows), cudaMemcpyDeviceToHost, stream));
  if (top > 0) {
    R3_CUDA_CHECK(cudaMemcpyAsync(host_tops, device_tops, tops_bytes(rows, top), cudaMemcpyDeviceToHost, stream));
  }
  R3_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t r = 0; r < rows; ++r) {
    const DrawResult& res = host_results[r];
    DrawnToken& out = drawn[static_cast<std::size_t>(r)];
    out = DrawnToken{};
    out.token = res.token;
    out.logprob = res.logprob;
    out.nonfinite_token = res.nonfinite_token;
    out.nonfinite_value = res.nonfinite_value;
    for (int32_t i = 0; i < res.top_count; ++i) {
      const TopEntry& e = host_tops[r * stride + i];
      out.top.push_back({e.token, e.logprob});
    }
  }
}

}  // namespace r3::ops::cuda
