// The `monolithic` MoE path on the GPU (--moe-path monolithic): one kernel for a whole MoE layer
// of a decode step of up to kPairMajorTokens tokens, as the CPU's monolithic path is one routine
// for gate, top-k and experts. It runs, in this order, the router projection, the routing with
// its capture write (the logical ids reach the capture rows before anything maps them), the EPLB
// map with the load counts, the gate/up GEMVs with the activation, the down GEMVs and the
// weighted combine. The separate kernels of the other paths do the same work with the same
// arithmetic (each dot product, sum and rounding is theirs, from the same device functions), so
// every path gives the same bits and a step may take any, with --batch-invariant too.
//
// It does not pay, and is not the default: a kernel boundary inside a CUDA graph costs 0.5 to
// 1.1 us (bench/launch_gap.cu), less than what the stages' synchronisation here costs; at batch 1
// of Qwen3-30B-A3B a decode step took 4.60 ms this way against 3.78 ms on the mega path
// (bench/RESULTS.md, 2026-12-05). How it synchronises: the blocks take tickets in launch order
// from a counter (a block takes one only once it is running), stages wait on counters of the
// stages before them, and a block never waits on a later ticket, so the kernel cannot deadlock
// however many blocks are resident. The counters live in a small device buffer
// (MonolithicMoeSync) that the kernel leaves zeroed for its next launch, so CUDA graphs replay it
// as is.
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/device_experts.h"
#include "moe/device_routing.h"

namespace r3::moe {

// The EPLB map as the monolithic kernel applies it (moe/device_expert_map.h's tables): logical expert
// e's replicas are replicas[offsets[e], offsets[e + 1]); pair (token t, choice c) takes replica
// (t * k + c) % count, and is counted into counts[physical] when seqs[t] >= 0 (counts may be
// null). offsets == nullptr: no map, the experts are the logical ones.
struct MonolithicMoeMap {
  const int32_t* offsets = nullptr;
  const int32_t* replicas = nullptr;
  const int32_t* seqs = nullptr;
  int32_t* counts = nullptr;
};

// Everything one monolithic launch reads and writes besides the experts.
struct MonolithicMoeStep {
  const Tensor* hidden = nullptr;         // device F32 [tokens, H], tokens <= kPairMajorTokens
  const Tensor* router = nullptr;         // device F32 [experts, H]: the gate projection
  // The experts' input, device F32 [tokens, the experts' width]: Kimi K3's latent rows; null: hidden.
  const Tensor* experts_input = nullptr;
  const Tensor* router_bias = nullptr;    // device F32 [experts] or null
  DeviceRoutingRule rule;
  const int32_t* forced = nullptr;        // replay, as route_on_device takes it
  const uint8_t* replayed = nullptr;
  DeviceCaptureRows capture;
  MonolithicMoeMap map;
  int32_t* ids = nullptr;                 // device [tokens, k]: the logical ids, written
  float* weights = nullptr;               // device [tokens, k]: the routing weights, written
};

#if R3_WITH_CUDA
// The counters one layer's monolithic kernel synchronises its stages with: device ints, zero between
// launches. One per MoE layer (launches on one stream never overlap, but per-layer buffers keep
// a failed launch from affecting the next layer).
class MonolithicMoeSync {
 public:
  explicit MonolithicMoeSync(backend::Context& ctx);
  int32_t* counters() const { return counters_.data<int32_t>(); }

 private:
  mutable Tensor counters_;
};

// Whether the monolithic kernel takes a step of `tokens` tokens with these experts: at most
// kPairMajorTokens tokens, and rows that take eight-value loads (every real checkpoint's).
bool monolithic_moe_fits(const DeviceExperts& experts, int64_t tokens);

// One MoE layer (routed experts only) into out: device F32 [tokens, the experts' width], overwritten. Scratch:
// device F32 of monolithic_moe_scratch_floats(...) floats.
int64_t monolithic_moe_scratch_floats(const DeviceExperts& experts, int64_t tokens, int64_t logical_experts, int64_t k);
void monolithic_moe_on_device(backend::Context& ctx, const MonolithicMoeStep& step, const DeviceExperts& experts,
                        const MonolithicMoeSync& sync, Tensor& scratch, Tensor& out);
#endif

}  // namespace r3::moe
