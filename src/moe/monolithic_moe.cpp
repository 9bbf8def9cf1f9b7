#include "moe/monolithic_moe.h"

#include "moe/expert_kernels.h"
#include "moe/softmax_topk.h"
#include "ops/dot.h"

namespace r3::moe {

MonolithicMoe::MonolithicMoe(int64_t layer_id, Tensor gate_weight, int64_t top_k, bool normalize_topk,
                             std::shared_ptr<PhysicalExperts> experts, bool can_capture)
    : MoeBlock(layer_id, std::move(experts)),
      gate_weight_(std::move(gate_weight)),
      top_k_(top_k),
      normalize_topk_(normalize_topk),
      can_capture_(can_capture) {
  R3_CHECK(gate_weight_.rank() == 2 && gate_weight_.dim(0) == this->experts().num_logical(),
           "MoE layer ", layer_id, ": gate must be [num_experts, hidden]");
}

std::string MonolithicMoe::kernel_name() const {
  return can_capture_ ? "cpu-fused-softmax-topk" : "cpu-fused-softmax-topk-nocapture";
}

void MonolithicMoe::set_capture(CaptureSink sink) {
  R3_CHECK(can_capture_ || !sink, "Routed-experts capture is not supported with monolithic MoE kernel ",
           kernel_name(), ".");
  sink_ = std::move(sink);
}

void MonolithicMoe::forward(ThreadPool& pool, const Tensor& hidden, std::span<const int32_t> forced,
                            Tensor& out) const {
  const int64_t tokens = hidden.dim(0), h = hidden.dim(1), experts_n = gate_weight_.dim(0);
  if (!forced.empty()) check_forced_routing(forced, tokens, top_k_, experts_n, layer_id());
  // Routing stage of the fused kernel: gate, softmax, top-k, weights, per token.
  Routing routing;
  routing.resize(tokens, top_k_);
  pool.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> logits(static_cast<std::size_t>(experts_n));
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t e = 0; e < experts_n; ++e) {
        logits[static_cast<std::size_t>(e)] =
            ops::dot(hidden.data<float>() + t * h, gate_weight_.data<float>() + e * h, h);
      }
      auto forced_row = forced.empty() ? forced : forced.subspan(static_cast<std::size_t>(t * top_k_),
                                                                 static_cast<std::size_t>(top_k_));
      softmax_topk_route(logits, top_k_, normalize_topk_, forced_row,
                         routing.expert_ids.data() + t * top_k_, routing.weights.data() + t * top_k_);
    }
  });
  // The kernel writes its routing to the capture buffer (when it can), then maps and computes.
  const CapturedRouting captured = capture(std::move(routing), layer_id(), sink_);
  const PhysicalRouting physical = experts().map(captured);
  fused_experts(pool, hidden, physical, experts(), out);
}

}  // namespace r3::moe
