// One forward step over several sequences with routed-experts capture: checks each sequence on
// its own, builds the batch (each accepted sequence's tokens in order, then any padding rows),
// runs the model, and hands every sequence exactly the captured rows of its own tokens. Padding
// rows are computed like any row but never attributed to a sequence. Replayed and freely routed
// sequences share a step: the batch carries a per-row replay mask.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backend/context.h"
#include "core/function_ref.h"
#include "engine/routed_experts.h"
#include "models/causal_lm.h"
#include "moe/capture_binder.h"
#include "moe/eplb/eplb_controller.h"
#include "moe/routing_capturer.h"

namespace r3::engine {

struct StepSequence {
  int32_t seq = 0;                   // KV cache sequence
  std::vector<int32_t> tokens;        // continue the sequence's cached prefix
  RoutedExperts* routed = nullptr;    // receives one row per token
  std::vector<int32_t> forced;        // replayed routing [tokens, L_moe, K], or empty
  // Set by run_each when the sequence was refused (it then did not run, and its cache and
  // routed rows are unchanged); empty when it ran.
  std::string error = {};
};

class StepRunner {
 public:
  // max_tokens: the largest step (rows, padding included) the capture buffer is sized for.
  // dispatcher: an expert-parallel rank's, which its MoE layers send their routed rows through;
  // the group then runs EPLB over every rank's loads, so this runner has no EPLB control of its
  // own. nullptr: a single rank.
  StepRunner(models::CausalLM& model, backend::Context& ctx, models::ModelCache& cache, int64_t max_tokens,
             bool keep_weights = false, const moe::Dispatcher* dispatcher = nullptr);

  // Runs the sequences that pass their checks; a refused one gets its `error` set and does not
  // stop the others. Returns logits F32 [sequences, vocab] of each sequence's last token (rows of
  // refused sequences are zeros), or of every row of the batch with all_logits.
  Tensor run_each(std::vector<StepSequence>& sequences, int64_t padding_rows = 0, bool all_logits = false);
  // run_each, throwing the first refusal as r3::Error.
  Tensor run(std::vector<StepSequence> sequences, int64_t padding_rows = 0, bool all_logits = false);
  // run, then draws[i] from sequence i's last logits row into the result's entry i: on the device
  // when the model draws tokens itself (its logits then never reach the host), on the host
  // otherwise, by the same rules (engine/host_draw.h).
  std::vector<ops::DrawnToken> run_drawn(std::vector<StepSequence> sequences, std::span<const ops::TokenDraw> draws);

  // A step of one padding row and no sequence: an expert-parallel rank without work of its own
  // takes part in the step's all-to-alls (and runs its experts for the other ranks' rows).
  void run_idle();

  // Why `sequence` cannot run now (empty when it can): tokens outside the vocabulary, a sequence
  // out of range or used twice in the step, the cache capacity, a replayed routing of the
  // wrong size or with ids outside [0, num_experts) or repeated in a row.
  std::string check(const StepSequence& sequence) const;

  const moe::RoutingCapturer& capturer() const { return capturer_; }
  // EPLB control over the model's MoE layers (when its EPLB options ask for it), or nullptr.
  const moe::EplbController* eplb() const { return eplb_ ? &*eplb_ : nullptr; }
  // The last step's tokens per physical expert (padding rows not counted).
  const moe::ExpertLoads& loads() const { return loads_; }

 private:
  // Checks every sequence (setting its `error`), sequences used twice included; the accepted indices.
  std::vector<std::size_t> accept(std::vector<StepSequence>& sequences) const;
  // Builds the accepted sequences' batch (padding rows after them), runs `forward` on it, and
  // hands each sequence its captured rows.
  void execute(const std::vector<StepSequence>& sequences, const std::vector<std::size_t>& accepted,
               int64_t padding_rows, bool all_logits, FunctionRef<void(const models::ForwardBatch&)> forward);
  // The accepted sequences' step with its logits: one row per sequence in the caller's order
  // (zeros for a refused one), or every batch row with all_logits.
  Tensor logits_of(const std::vector<StepSequence>& sequences, const std::vector<std::size_t>& accepted,
                   int64_t padding_rows, bool all_logits);
  // forward_into the step's host logits buffer.
  Tensor host_logits(const models::ForwardBatch& batch);

  models::CausalLM& model_;
  backend::Context& ctx_;
  models::ModelCache& cache_;
  const moe::Dispatcher* dispatcher_;
  moe::RoutingCapturer capturer_;
  moe::ExpertLoads loads_;  // this step's tokens per physical expert
  Tensor logits_buffer_;    // the steps' logits, [most rows so far, vocab] on the host
  std::optional<moe::EplbController> eplb_;
};

}  // namespace r3::engine
