// The monolithic MoE kernel (moe/device_monolithic_moe.h). Blocks of 8 warps; each takes the next ticket of
// the launch, and the tickets run the stages in order:
//   router   one warp per expert's gate row, for every token (sm90_linear_rows.cu's sums);
//   routing  one block, one warp per token (routing_parts.cuh), then the EPLB map and counts;
//   gate/up  one warp per (pair, intermediate row) (experts_by_pair.cuh);
//   down     one warp per (token, hidden row): the k choices' down rows and the combine.
// A stage's tickets wait for the stage before (a counter each, bumped once per finished
// ticket): routing for every router ticket, gate/up for the routing, down for every gate/up
// ticket. The waits and bumps are the release/acquire pattern of a split-K semaphore: a block's
// writes, a barrier, then its thread 0 fences and bumps; the waiting block's thread 0 spins on an
// acquiring load, then a barrier lets its other threads read.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "moe/cuda/experts_by_pair.cuh"
#include "moe/cuda/experts_parts.cuh"
#include "moe/cuda/routing_parts.cuh"
#include "moe/device_monolithic_moe.h"
#include "ops/cuda/warp_row_dots.cuh"

namespace r3::moe {

namespace {

using ops::cuda::kWarp;
using routing_detail::WarpScratch;
constexpr int kWarpsPerBlock = 8;
constexpr unsigned kThreads = kWarpsPerBlock * kWarp;

// The counters (MonolithicMoeSync): the next ticket, then each stage's finished tickets, each in a
// 128-byte line of its own, so that blocks polling one counter do not slow the atomics on another.
constexpr int kLine = 32;
enum Counter : int {
  kTicket = 0,
  kRouterDone = kLine,
  kRouted = 2 * kLine,
  kGateUpDone = 3 * kLine,
  kDownDone = 4 * kLine,
  kCounters = 5 * kLine
};

// Scratch offsets, in floats, each 64-float aligned for the eight-value loads.
constexpr int64_t aligned64(int64_t n) { return (n + 63) / 64 * 64; }
struct ScratchLayout {
  int64_t logits, physical, activated, total;
  ScratchLayout(int64_t tokens, int64_t logical_experts, int64_t k, int64_t inter)
      : logits(0),
        physical(aligned64(tokens * logical_experts)),
        activated(physical + aligned64(tokens * k)),
        total(activated + aligned64(tokens * k * inter)) {}
};

struct Params {
  const float* hidden;       // the router's input [tokens, router_h]
  const float* experts_in;   // the experts' [tokens, h]
  int64_t tokens, router_h, h, inter, k;
  const float* router;
  const float* router_bias;
  int64_t logical_experts;
  bool router_vec8;
  DeviceRoutingRule rule;
  const int32_t* forced;
  const uint8_t* replayed;
  DeviceCaptureRows capture;
  MonolithicMoeMap map;
  int32_t* ids;
  float* weights;
  float* logits;
  int32_t* physical;  // == ids without a map
  float* activated;
  const float* gate_bias;
  const float* up_bias;
  const float* down_bias;
  float* out;
  int32_t* counters;
  int32_t router_tickets, gate_up_tickets, down_tickets;
};

__device__ inline int32_t load_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The whole block: returns once `counter` has reached `target`, with the writes before each bump
// visible to every thread of the block.
__device__ inline void wait_for(const int32_t* counter, int32_t target) {
  if (threadIdx.x == 0) {
    // A short sleep between polls: hundreds of blocks may wait on one counter.
    while (load_acquire(counter) < target) __nanosleep(64);
  }
  __syncthreads();
}

// The whole block: bumps `counter` after every thread's writes; returns the count before (in
// thread 0 only).
__device__ inline int32_t finished(int32_t* counter) {
  __syncthreads();
  int32_t before = 0;
  if (threadIdx.x == 0) {
    __threadfence();
    before = atomicAdd(counter, 1);
  }
  return before;
}

// Warp `warp`'s gate row, for every token: logits[t * E + e] (+ bias), as sm90_linear_rows.cu's
// rows kernel sums it (the same lanes' elements in the same order, whatever its rows per pass).
template <bool kVec8>
__device__ inline void router_row_sums(const Params& p, int64_t e, int lane) {
  const float* rows[kPairMajorTokens];
#pragma unroll
  for (int j = 0; j < kPairMajorTokens; ++j) {
    rows[j] = p.hidden + min(static_cast<int64_t>(j), p.tokens - 1) * p.router_h;
  }
  float acc[1][kPairMajorTokens] = {};
  const ops::cuda::PlainRow<float> w[1] = {{p.router + e * p.router_h}};
  ops::cuda::row_dots<kVec8>(w, rows, static_cast<int>(p.tokens), p.router_h, lane, acc);
#pragma unroll
  for (int j = 0; j < kPairMajorTokens; ++j) {
    const float sum = ops::cuda::warp_sum(acc[0][j]);
    if (lane == 0 && j < p.tokens) {
      p.logits[j * p.logical_experts + e] = p.router_bias != nullptr ? sum + p.router_bias[e] : sum;
    }
  }
}

// The router and routing stages are calls, not inlined: the registers they need are saved around
// the call instead of being held by the whole kernel, whose gate/up and down loops then keep the
// separate kernels' register counts (and blocks per SM).
__device__ __noinline__ void router_row(const Params& p, int64_t e, int lane) {
  if (p.router_vec8) router_row_sums<true>(p, e, lane);
  else router_row_sums<false>(p, e, lane);
}

// Token t's logical ids (in w.ids after routing) to physical ones, as map_pairs does.
__device__ inline void map_token(const Params& p, int64_t t, const int32_t* logical, int lane) {
  for (int64_t c = lane; c < p.k; c += kWarp) {
    const int64_t i = t * p.k + c;
    const int32_t e = logical[c];
    const int32_t first = p.map.offsets[e], count = p.map.offsets[e + 1] - first;
    const int32_t physical = p.map.replicas[first + static_cast<int32_t>(i % count)];
    p.physical[i] = physical;
    if (p.map.counts != nullptr && p.map.seqs[t] >= 0) atomicAdd(&p.map.counts[physical], 1);
  }
}

// Blocks an SM should hold: bfloat16 rows get the four (64 registers a thread) of the separate
// gate/up kernel, which the kernel's other stages would otherwise push to 80 registers and three
// blocks; the others two (MXFP4 would take 174 registers and one).
template <typename Matrix>
constexpr int kMinBlocks = std::is_same_v<Matrix, ops::cuda::PlainMatrix<__nv_bfloat16>> ? 4 : 2;

// One warp per token of the step: its routing, then its ids mapped.
__device__ __noinline__ void route_and_map(const Params& p, WarpScratch& w, int64_t t, int lane) {
  routing_detail::route_token(p.logits, t, p.logical_experts, p.rule, p.forced, p.replayed, p.ids, p.weights, p.capture,
                              w, lane);
  if (p.map.offsets != nullptr) map_token(p, t, w.ids, lane);
}

template <typename Matrix, typename Act>
__global__ void __launch_bounds__(kThreads, kMinBlocks<Matrix>) monolithic_moe(const __grid_constant__ Params p, Matrix gate, Matrix up, Matrix down, Act act) {
  backend::cuda::wait_for_predecessor();
  extern __shared__ __align__(16) unsigned char shared[];  // the routing's WarpScratch, one per token
  __shared__ int32_t ticket_of_block;
  const int32_t tickets = p.router_tickets + 1 + p.gate_up_tickets + p.down_tickets;
  if (threadIdx.x == 0) {
    ticket_of_block = atomicAdd(&p.counters[kTicket], 1);
    // The last ticket: every block of the launch holds its own, so the counter can start over.
    if (ticket_of_block == tickets - 1) p.counters[kTicket] = 0;
  }
  __syncthreads();
  int32_t ticket = ticket_of_block;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;

  if (ticket < p.router_tickets) {
    const int64_t e = static_cast<int64_t>(ticket) * kWarpsPerBlock + warp;
    if (e < p.logical_experts) router_row(p, e, lane);
    finished(&p.counters[kRouterDone]);
    return;
  }
  ticket -= p.router_tickets;

  if (ticket == 0) {
    wait_for(&p.counters[kRouterDone], p.router_tickets);
    if (warp < p.tokens) route_and_map(p, reinterpret_cast<WarpScratch*>(shared)[warp], warp, lane);
    finished(&p.counters[kRouted]);
    return;
  }
  ticket -= 1;

  if (ticket < p.gate_up_tickets) {
    wait_for(&p.counters[kRouted], 1);
    const int64_t unit = static_cast<int64_t>(ticket) * kWarpsPerBlock + warp;
    const int64_t pair = unit / p.inter, i = unit % p.inter;
    if (pair < p.tokens * p.k) {
      experts_detail::gate_up_pair_row<true>(p.experts_in, p.physical, p.k, pair, i, gate, up, p.gate_bias, p.up_bias, p.h,
                                             p.inter, act, p.activated, lane);
    }
    finished(&p.counters[kGateUpDone]);
    return;
  }
  ticket -= p.gate_up_tickets;

  wait_for(&p.counters[kGateUpDone], p.gate_up_tickets);
  {
    // A warp per hidden row: a block's fixed costs (its ticket, the wait, the bump) are paid once
    // for eight rows, not once per row.
    const int64_t row = static_cast<int64_t>(ticket) * kWarpsPerBlock + warp, t = row / p.h, d = row % p.h;
    if (t < p.tokens) {
      experts_detail::down_and_combine_row_in_warp<true>(p.activated, p.physical, p.weights, p.k, down, p.down_bias,
                                                         p.h, p.inter, t, d, p.out, lane);
    }
  }
  // The last block to finish: every other block is past its waits, so the counters start over.
  if (finished(&p.counters[kDownDone]) == p.down_tickets - 1) {
    p.counters[kRouterDone] = 0;
    p.counters[kRouted] = 0;
    p.counters[kGateUpDone] = 0;
    p.counters[kDownDone] = 0;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

MonolithicMoeSync::MonolithicMoeSync(backend::Context& ctx) {
  counters_ = backend::to_device(ctx, Tensor::from(std::vector<int32_t>(kCounters, 0), {kCounters}));
}

bool monolithic_moe_fits(const DeviceExperts& experts, int64_t tokens) {
  return tokens >= 1 && tokens <= kPairMajorTokens && experts_detail::experts_vec8(experts);
}

int64_t monolithic_moe_scratch_floats(const DeviceExperts& experts, int64_t tokens, int64_t logical_experts, int64_t k) {
  return ScratchLayout(tokens, logical_experts, k, experts.intermediate()).total;
}

void monolithic_moe_on_device(backend::Context& ctx, const MonolithicMoeStep& step, const DeviceExperts& experts,
                        const MonolithicMoeSync& sync, Tensor& scratch, Tensor& out) {
  const Tensor& hidden = *step.hidden;
  const Tensor& router = *step.router;
  const Tensor& experts_in = step.experts_input != nullptr ? *step.experts_input : hidden;
  const int64_t tokens = hidden.dim(0), h = experts.hidden(), inter = experts.intermediate();
  const int64_t logical = router.dim(0), k = step.rule.k;
  R3_CHECK(monolithic_moe_fits(experts, tokens), "monolithic MoE (cuda): ", tokens, " tokens (at most ", kPairMajorTokens,
           ") with experts of ", h, " x ", inter);
  R3_CHECK(hidden.rank() == 2 && router.rank() == 2 && router.dim(1) == hidden.dim(1) && router.dtype() == DType::F32 &&
               experts_in.rank() == 2 && experts_in.dim(0) == tokens && experts_in.dim(1) == h &&
               out.shape() == experts_in.shape() && aligned16(experts_in.raw_data()) &&
               (step.router_bias == nullptr || step.router_bias->numel() == logical),
           "monolithic MoE (cuda): hidden ", shape_to_string(hidden.shape()), ", router ", shape_to_string(router.shape()),
           ", experts' input ", shape_to_string(experts_in.shape()), ", experts of ", h, " x ", inter);
  check_device_routing(step.rule, logical);
  const ScratchLayout layout(tokens, logical, k, inter);
  R3_CHECK(scratch.dtype() == DType::F32 && scratch.numel() >= layout.total, "monolithic MoE (cuda): scratch too small");
  float* base = scratch.data<float>();
  Params p{};
  p.hidden = hidden.data<float>();
  p.experts_in = experts_in.data<float>();
  p.tokens = tokens;
  p.router_h = hidden.dim(1);
  p.h = h;
  p.inter = inter;
  p.k = k;
  p.router = router.data<float>();
  p.router_bias = step.router_bias != nullptr ? step.router_bias->data<float>() : nullptr;
  p.logical_experts = logical;
  // The rows kernel's choice for the same projection (sm90_linear_rows.cu), so the sums match it.
  p.router_vec8 = ops::cuda::weights_vec8(router) && aligned16(hidden.raw_data());
  p.rule = step.rule;
  p.forced = step.forced;
  p.replayed = step.replayed;
  p.capture = step.capture;
  p.map = step.map;
  p.ids = step.ids;
  p.weights = step.weights;
  p.logits = base + layout.logits;
  p.physical = step.map.offsets != nullptr ? reinterpret_cast<int32_t*>(base + layout.physical) : step.ids;
  p.activated = base + layout.activated;
  const auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  p.gate_bias = bias(experts.gate_bias);
  p.up_bias = bias(experts.up_bias);
  p.down_bias = bias(experts.down_bias);
  p.out = out.data<float>();
  p.counters = sync.counters();
  const auto count = [](int64_t n) { return static_cast<int32_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock); };
  p.router_tickets = count(logical);
  p.gate_up_tickets = count(tokens * k * inter);
  p.down_tickets = count(tokens * h);
  const auto blocks = static_cast<unsigned>(p.router_tickets + 1 + p.gate_up_tickets + p.down_tickets);
  const std::size_t shared_bytes = static_cast<std::size_t>(tokens) * sizeof(WarpScratch);
  const cudaStream_t stream = ctx.cuda_state().stream;
  experts_detail::with_expert_matrices(experts, [&](auto gate, auto up, auto down) {
    experts_detail::with_activation(experts.activation, [&](auto act) {
      backend::cuda::launch_kernel(monolithic_moe<decltype(gate), decltype(act)>, blocks, kThreads, shared_bytes, stream, p,
                                   gate, up, down, act);
    });
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::moe
