// The softmax top-k routing rule of Qwen3-MoE, Qwen2-MoE, Mixtral and OLMoE, for one token:
// probabilities = softmax(gate logits); selection = the k largest (or a forced routing when
// replaying); weights = the probabilities at the selection, renormalised to sum 1 if asked.
// Shared by the router object and by the fused kernels so the rule exists once.
#pragma once

#include <cstdint>
#include <span>

namespace r3::moe {

// logits: one token's gate output (overwritten with probabilities). forced: k ids to use
// instead of the top-k, or empty. Writes k ids and weights.
void softmax_topk_route(std::span<float> logits, int64_t k, bool normalize,
                        std::span<const int32_t> forced, int32_t* ids, float* weights);

}  // namespace r3::moe
