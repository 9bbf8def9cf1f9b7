#include "engine/step_runner.h"

namespace r3::engine {

StepRunner::StepRunner(models::CausalLM& model, ThreadPool& pool, models::ModelCache& cache,
                       int64_t max_tokens, bool keep_weights)
    : model_(model),
      pool_(pool),
      cache_(cache),
      capturer_(max_tokens, static_cast<int64_t>(model.info().moe_layers.size()), model.info().top_k,
                model.info().num_experts, keep_weights),
      binding_(model.moe_blocks(), capturer_.sink()) {}

Tensor StepRunner::run(const std::vector<StepSequence>& sequences, int64_t padding_rows, bool all_logits) {
  R3_CHECK(!sequences.empty(), "step: no sequences");
  const bool forced = !sequences.front().forced.empty();
  const auto per_row = static_cast<std::size_t>(capturer_.num_moe_layers() * capturer_.top_k());
  models::ForwardBatch batch;
  std::vector<int64_t> first_row;
  for (const StepSequence& s : sequences) {
    R3_CHECK(!s.tokens.empty(), "step: a sequence without tokens");
    R3_CHECK(s.forced.empty() != forced, "step: replayed routing must be given for every sequence or none");
    R3_CHECK(!forced || s.forced.size() == s.tokens.size() * per_row, "step: replayed routing of slot ",
             s.slot, " has ", s.forced.size(), " ids for ", s.tokens.size(), " tokens");
    first_row.push_back(batch.size());
    const auto start = static_cast<int32_t>(cache_.length(s.slot));
    for (std::size_t i = 0; i < s.tokens.size(); ++i) {
      batch.token_ids.push_back(s.tokens[i]);
      batch.positions.push_back(start + static_cast<int32_t>(i));
      batch.slots.push_back(s.slot);
    }
    batch.logit_rows.push_back(batch.size() - 1);
    batch.forced_routing.insert(batch.forced_routing.end(), s.forced.begin(), s.forced.end());
  }
  for (int64_t p = 0; p < padding_rows; ++p) {
    batch.token_ids.push_back(0);
    batch.positions.push_back(0);
    batch.slots.push_back(models::ForwardBatch::kPadding);
    if (forced) {  // any valid routing: experts 0..k-1
      for (int64_t l = 0; l < capturer_.num_moe_layers(); ++l) {
        for (int32_t k = 0; k < capturer_.top_k(); ++k) batch.forced_routing.push_back(k);
      }
    }
  }

  if (all_logits) batch.logit_rows.clear();
  capturer_.begin_step(batch.size());
  Tensor logits = model_.forward(pool_, batch, cache_);
  capturer_.end_step();
  model_.end_step();
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].routed == nullptr) continue;
    for (std::size_t t = 0; t < sequences[i].tokens.size(); ++t) {
      sequences[i].routed->append(capturer_, first_row[i] + static_cast<int64_t>(t));
    }
  }
  return logits;
}

}  // namespace r3::engine
