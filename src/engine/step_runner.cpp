#include "engine/step_runner.h"

#include <algorithm>
#include <set>

#include "backend/device_memory.h"
#include "engine/host_draw.h"

namespace r3::engine {

StepRunner::StepRunner(models::CausalLM& model, backend::Context& ctx, models::ModelCache& cache,
                       int64_t max_tokens, bool keep_weights, const moe::Dispatcher* dispatcher)
    : model_(model),
      ctx_(ctx),
      cache_(cache),
      dispatcher_(dispatcher),
      capturer_(max_tokens, static_cast<int64_t>(model.info().moe_layers.size()), model.info().top_k,
                model.info().num_experts, keep_weights),
      loads_([&] {
        std::vector<int64_t> physical;
        for (moe::MoeBlock* block : model.moe_blocks()) physical.push_back(block->experts().num_physical());
        return physical;
      }()) {
  moe::check_routing_capture(model.moe_blocks());  // start-up errors before any token runs
  if (model.eplb_options().active() && dispatcher == nullptr) {
    std::vector<moe::PhysicalExperts*> experts;
    for (moe::MoeBlock* block : model.moe_blocks()) experts.push_back(&block->experts());
    eplb_.emplace(model.eplb_options(), std::move(experts));
  }
}

std::string StepRunner::check(const StepSequence& s) const {
  const models::ModelInfo& info = model_.info();
  if (s.tokens.empty()) return "a sequence without tokens";
  if (s.seq < 0 || s.seq >= cache_.max_seqs()) {
    return detail::concat("seq ", s.seq, " is outside [0, ", cache_.max_seqs(), ")");
  }
  for (int32_t id : s.tokens) {
    if (id < 0 || id >= info.vocab_size) {
      return detail::concat("token id ", id, " is outside the vocabulary [0, ", info.vocab_size, ")");
    }
  }
  const int64_t end = cache_.length(s.seq) + static_cast<int64_t>(s.tokens.size());
  if (end > cache_.capacity()) {
    return detail::concat("sequence of ", end, " tokens exceeds the cache capacity of ", cache_.capacity());
  }
  if (s.forced.empty()) return "";
  const auto k = static_cast<std::size_t>(info.top_k);
  const std::size_t per_row = info.moe_layers.size() * k;
  if (s.forced.size() != s.tokens.size() * per_row) {
    return detail::concat("replayed routing has ", s.forced.size(), " ids for ", s.tokens.size(), " tokens x ",
                          info.moe_layers.size(), " MoE layers x top-", k);
  }
  for (std::size_t i = 0; i < s.forced.size(); i += k) {
    const std::string problem = moe::forced_row_problem({s.forced.data() + i, k}, info.num_experts);
    if (!problem.empty()) {
      return detail::concat("replayed routing at token ", i / per_row, ", MoE layer ", i % per_row / k, ": ", problem);
    }
  }
  return "";
}

std::vector<std::size_t> StepRunner::accept(std::vector<StepSequence>& sequences) const {
  R3_CHECK(!sequences.empty(), "step: no sequences");
  std::set<int32_t> seqs_seen;
  std::vector<std::size_t> accepted;
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    StepSequence& s = sequences[i];
    s.error = check(s);
    if (s.error.empty() && !seqs_seen.insert(s.seq).second) {
      s.error = detail::concat("seq ", s.seq, " appears twice in one step");
    }
    if (s.error.empty()) accepted.push_back(i);
  }
  return accepted;
}

Tensor StepRunner::run_each(std::vector<StepSequence>& sequences, int64_t padding_rows, bool all_logits) {
  const std::vector<std::size_t> accepted = accept(sequences);
  return logits_of(sequences, accepted, padding_rows, all_logits);
}

Tensor StepRunner::run(std::vector<StepSequence> sequences, int64_t padding_rows, bool all_logits) {
  const std::vector<std::size_t> accepted = accept(sequences);
  for (const StepSequence& s : sequences) R3_CHECK(s.error.empty(), s.error);  // nothing runs
  return logits_of(sequences, accepted, padding_rows, all_logits);
}

std::vector<ops::DrawnToken> StepRunner::run_drawn(std::vector<StepSequence> sequences,
                                                   std::span<const ops::TokenDraw> draws) {
  R3_CHECK(draws.size() == sequences.size(), "step: ", draws.size(), " draws for ", sequences.size(), " sequences");
  const std::vector<std::size_t> accepted = accept(sequences);
  for (const StepSequence& s : sequences) R3_CHECK(s.error.empty(), s.error);  // nothing runs
  std::vector<ops::DrawnToken> drawn(sequences.size());
  execute(sequences, accepted, 0, false, [&](const models::ForwardBatch& batch) {
    if (model_.draws_tokens()) return model_.forward_drawn(ctx_, batch, cache_, draws, drawn);
    const Tensor logits = host_logits(batch);
    const int64_t vocab = model_.info().vocab_size;
    for (std::size_t i = 0; i < drawn.size(); ++i) {
      drawn[i] = draw_on_host({logits.data<float>() + static_cast<int64_t>(i) * vocab, static_cast<std::size_t>(vocab)},
                              draws[i]);
    }
  });
  return drawn;
}

void StepRunner::run_idle() {
  execute({}, {}, 1, false, [&](const models::ForwardBatch& batch) { host_logits(batch); });
}

Tensor StepRunner::host_logits(const models::ForwardBatch& batch) {
  // The logits land in a host buffer kept across steps (page-locked on a GPU: the step's copy of
  // [rows, vocab] float32 is then several times faster), replaced when a step needs more rows or
  // a caller still holds the logits of an earlier step.
  const int64_t rows = models::logit_row_count(batch), vocab = model_.info().vocab_size;
  if (!logits_buffer_.defined() || logits_buffer_.dim(0) < rows || logits_buffer_.storage_shared()) {
    logits_buffer_ = backend::host_staging_empty(ctx_, DType::F32, {rows, vocab});
  }
  Tensor logits = logits_buffer_.rows(0, rows);
  model_.forward_into(ctx_, batch, cache_, logits);
  return logits;
}

Tensor StepRunner::logits_of(const std::vector<StepSequence>& sequences, const std::vector<std::size_t>& accepted,
                             int64_t padding_rows, bool all_logits) {
  const int64_t vocab = model_.info().vocab_size;
  if (accepted.empty()) return Tensor::empty(DType::F32, {static_cast<int64_t>(sequences.size()), vocab});
  Tensor logits;
  execute(sequences, accepted, padding_rows, all_logits,
          [&](const models::ForwardBatch& batch) { logits = host_logits(batch); });
  if (all_logits || accepted.size() == sequences.size()) return logits;
  // One row per sequence, in the caller's order; refused sequences keep a zero row.
  Tensor per_sequence = Tensor::empty(DType::F32, {static_cast<int64_t>(sequences.size()), vocab});
  for (std::size_t a = 0; a < accepted.size(); ++a) {
    std::copy_n(logits.data<float>() + static_cast<int64_t>(a) * vocab, vocab,
                per_sequence.data<float>() + static_cast<int64_t>(accepted[a]) * vocab);
  }
  return per_sequence;
}

void StepRunner::execute(const std::vector<StepSequence>& sequences, const std::vector<std::size_t>& accepted,
                         int64_t padding_rows, bool all_logits, FunctionRef<void(const models::ForwardBatch&)> forward) {
  const auto per_row = static_cast<std::size_t>(capturer_.num_moe_layers() * capturer_.top_k());
  const bool any_forced =
      std::any_of(accepted.begin(), accepted.end(), [&](std::size_t i) { return !sequences[i].forced.empty(); });

  models::ForwardBatch batch;
  std::vector<int64_t> first_row;
  for (std::size_t i : accepted) {
    const StepSequence& s = sequences[i];
    first_row.push_back(batch.size());
    const auto start = static_cast<int32_t>(cache_.length(s.seq));
    for (std::size_t t = 0; t < s.tokens.size(); ++t) {
      batch.token_ids.push_back(s.tokens[t]);
      batch.positions.push_back(start + static_cast<int32_t>(t));
      batch.seqs.push_back(s.seq);
    }
    batch.logit_rows.push_back(batch.size() - 1);
    if (!any_forced) continue;
    // Free sequences route by themselves: their placeholder ids are masked out.
    const bool replays = !s.forced.empty();
    if (replays) batch.forced_routing.insert(batch.forced_routing.end(), s.forced.begin(), s.forced.end());
    else batch.forced_routing.resize(batch.forced_routing.size() + s.tokens.size() * per_row, 0);
    batch.replayed.resize(batch.replayed.size() + s.tokens.size(), replays ? 1 : 0);
  }
  for (int64_t p = 0; p < padding_rows; ++p) {
    batch.token_ids.push_back(0);
    batch.positions.push_back(0);
    batch.seqs.push_back(models::ForwardBatch::kPadding);
    if (any_forced) {
      batch.forced_routing.resize(batch.forced_routing.size() + per_row, 0);
      batch.replayed.push_back(0);
    }
  }

  if (all_logits) batch.logit_rows.clear();
  batch.capture = &capturer_;
  batch.loads = &loads_;
  batch.dispatcher = dispatcher_;
  loads_.clear();
  capturer_.begin_step(batch.size());
  forward(batch);
  capturer_.end_step();
  if (eplb_) eplb_->end_step(loads_);
  for (std::size_t a = 0; a < accepted.size(); ++a) {
    const StepSequence& s = sequences[accepted[a]];
    if (s.routed == nullptr) continue;
    for (std::size_t t = 0; t < s.tokens.size(); ++t) s.routed->append(capturer_, first_row[a] + static_cast<int64_t>(t));
  }
}

}  // namespace r3::engine
