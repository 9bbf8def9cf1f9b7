// The routing kernels (moe/device_routing.h): one warp per token, each running
// routing_detail::route_token (routing_parts.cuh, where the arithmetic is described), or for
// softmax top-k over up to 256 experts route_softmax_topk_in_registers (routing_in_registers.cuh:
// the same bits, shorter on a decode step's critical path).

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "moe/cuda/routing_in_registers.cuh"
#include "moe/cuda/routing_parts.cuh"
#include "moe/device_routing.h"

namespace r3::moe {

namespace {

using routing_detail::kWarp;
using routing_detail::WarpScratch;
constexpr int kWarpsPerBlock = 4;

__global__ void route_tokens(const float* __restrict__ logits, int64_t tokens, int64_t experts, DeviceRoutingRule rule,
                             const int32_t* __restrict__ forced, const uint8_t* __restrict__ replayed,
                             int32_t* __restrict__ ids_out, float* __restrict__ weights_out, DeviceCaptureRows capture) {
  backend::cuda::wait_for_predecessor();
  __shared__ WarpScratch scratch[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarp;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (t >= tokens) return;
  routing_detail::route_token(logits, t, experts, rule, forced, replayed, ids_out, weights_out, capture,
                              scratch[threadIdx.x / kWarp], lane);
}

template <int kSlots>
__global__ void route_softmax_topk_tokens(const float* __restrict__ logits, int64_t tokens, int64_t experts,
                                          DeviceRoutingRule rule, const int32_t* __restrict__ forced,
                                          const uint8_t* __restrict__ replayed, int32_t* __restrict__ ids_out,
                                          float* __restrict__ weights_out, DeviceCaptureRows capture) {
  backend::cuda::wait_for_predecessor();
  __shared__ float rows[kWarpsPerBlock][kSlots * kWarp];
  const int lane = threadIdx.x % kWarp;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (t >= tokens) return;
  routing_detail::route_softmax_topk_in_registers<kSlots>(logits, t, experts, rule, forced, replayed, ids_out,
                                                          weights_out, capture, rows[threadIdx.x / kWarp], lane);
}

}  // namespace

void check_device_routing(const DeviceRoutingRule& rule, int64_t experts) {
  R3_CHECK(experts >= 1 && experts <= kMaxDeviceExperts && rule.k >= 1 && rule.k <= experts,
           "routing (cuda): top-", rule.k, " of ", experts, " experts (at most ", kMaxDeviceExperts, ")");
  R3_CHECK(rule.kind != DeviceRoutingRule::Kind::kSigmoidGroupTopK || rule.bias != nullptr,
           "routing (cuda): grouped sigmoid routing needs a correction bias");
  const bool grouped = rule.kind == DeviceRoutingRule::Kind::kSigmoidGroupTopK ||
                       rule.kind == DeviceRoutingRule::Kind::kSoftmaxGroupGreedy;
  R3_CHECK(!grouped || (rule.groups >= 1 && rule.groups <= 64 && experts % rule.groups == 0 && rule.topk_groups >= 1 &&
                        rule.topk_groups <= rule.groups),
           "routing (cuda): grouped routing needs 1 to 64 groups dividing ", experts, " experts");
}

DeviceCapturedRouting route_on_device(backend::Context& ctx, const Tensor& logits, const DeviceRoutingRule& rule,
                                      const int32_t* forced, const uint8_t* replayed, int32_t* ids, float* weights,
                                      DeviceCaptureRows capture) {
  R3_CHECK(logits.rank() == 2 && logits.is_contiguous() && logits.device() == Device::kCuda,
           "routing (cuda): logits must be a [tokens, experts] device tensor");
  const int64_t tokens = logits.dim(0), experts = logits.dim(1);
  check_device_routing(rule, experts);
  const DeviceCapturedRouting routed(ids, weights, tokens, rule.k);
  if (tokens == 0) return routed;
  const auto blocks = static_cast<unsigned>((tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  auto launch = [&](auto kernel) {
    backend::cuda::launch_kernel(kernel, blocks, kWarpsPerBlock * kWarp, 0, ctx.cuda_state().stream,
                                 logits.data<float>(), tokens, experts, rule, forced, replayed, ids, weights, capture);
  };
  const bool in_registers = rule.kind == DeviceRoutingRule::Kind::kSoftmaxTopK && rule.k <= kWarp &&
                            experts <= 8 * kWarp;
  if (!in_registers) launch(route_tokens);
  else if (experts <= 4 * kWarp) launch(route_softmax_topk_tokens<4>);
  else launch(route_softmax_topk_tokens<8>);
  R3_CUDA_CHECK(cudaGetLastError());
  return routed;
}

}  // namespace r3::moe
