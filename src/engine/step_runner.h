// One forward step over several sequences with routed-experts capture: builds the batch (each
// sequence's tokens in order, then any padding rows), binds capture for its lifetime, runs the
// model, and hands every sequence exactly the captured rows of its own tokens. Padding rows are
// computed like any row but never attributed to a sequence.
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "engine/routed_experts.h"
#include "models/causal_lm.h"
#include "moe/capture_binder.h"
#include "moe/routing_capturer.h"

namespace r3::engine {

struct StepSequence {
  int32_t slot = 0;                   // KV cache slot
  std::vector<int32_t> tokens;        // continue the slot's cached prefix
  RoutedExperts* routed = nullptr;    // receives one row per token
  std::vector<int32_t> forced;        // replayed routing [tokens, L_moe, K], or empty
};

class StepRunner {
 public:
  // max_tokens: the largest step (rows, padding included) the capture buffer is sized for.
  StepRunner(models::CausalLM& model, ThreadPool& pool, models::ModelCache& cache, int64_t max_tokens,
             bool keep_weights = false);

  // Returns logits F32 [sequences, vocab] of each sequence's last token, or of every row of the
  // batch with all_logits. Either every sequence carries a forced routing or none does.
  Tensor run(const std::vector<StepSequence>& sequences, int64_t padding_rows = 0, bool all_logits = false);

  const moe::RoutingCapturer& capturer() const { return capturer_; }

 private:
  models::CausalLM& model_;
  ThreadPool& pool_;
  models::ModelCache& cache_;
  moe::RoutingCapturer capturer_;
  moe::ScopedCaptureBinding binding_;
};

}  // namespace r3::engine
