#include "engine/rank_engine.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/checked.h"
#include "engine/host_draw.h"
#include "engine/logprobs.h"
#include "engine/routed_experts.h"

namespace r3::engine {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
  }
  return "none";
}

RankEngine::RankEngine(models::CausalLM& model, backend::Context& ctx, EngineOptions options,
                       const moe::Dispatcher* dispatcher)
    : model_(model), options_(options), dispatcher_(dispatcher) {
  const models::ModelInfo& info = model.info();
  options_.scheduler.validate();
  R3_CHECK(options_.block_size >= 1 && options_.block_size <= 4096, "KV block size must be in [1, 4096], got ",
           options_.block_size);
  if (options_.max_model_len == 0) options_.max_model_len = info.max_position_embeddings;
  R3_CHECK(options_.max_model_len > 0, "the model has no max_position_embeddings: give the engine a max model length");
  R3_CHECK(info.max_position_embeddings <= 0 || options_.max_model_len <= info.max_position_embeddings,
           "max model length ", options_.max_model_len, " exceeds the model's max_position_embeddings of ",
           info.max_position_embeddings);
  const int64_t per_seq = (options_.max_model_len + options_.block_size - 1) / options_.block_size;
  if (options_.kv_blocks == 0) {
    options_.kv_blocks = checked_mul(per_seq, options_.scheduler.max_running, "KV blocks");
  }
  R3_CHECK(options_.kv_blocks >= 1 && options_.kv_blocks <= INT32_MAX, "KV blocks must be in [1, 2^31), got ",
           options_.kv_blocks);
  per_row_ = static_cast<int64_t>(info.moe_layers.size()) * info.top_k;
  cache_ = model.make_paged_cache(options_.scheduler.max_running, options_.max_model_len, options_.kv_blocks,
                                  options_.block_size);
  bool prefix = options_.prefix_caching;
  if (prefix && !cache_->prefix_sharing_unsupported().empty()) {
    prefix_off_reason_ = cache_->prefix_sharing_unsupported();
    spdlog::info("prefix caching off for {}: {}", info.family, prefix_off_reason_);
    prefix = false;
  }
  options_.prefix_caching = prefix;
  kv_ = std::make_unique<KvManager>(*cache_, options_.kv_blocks, options_.block_size, prefix, per_row_,
                                    static_cast<int64_t>(info.moe_layers.size()));
  scheduler_ = std::make_unique<Scheduler>(options_.scheduler, *kv_);
  runner_ = std::make_unique<StepRunner>(model, ctx, *cache_, options_.scheduler.max_step_tokens, false, dispatcher);
}

RankEngine::~RankEngine() = default;

void RankEngine::check_request(const RequestParams& p) const {
  const models::ModelInfo& info = model_.info();
  R3_CHECK(!p.prompt.empty(), "the prompt is empty");
  for (const int32_t id : p.prompt) {
    R3_CHECK(id >= 0 && id < info.vocab_size, "prompt token id ", id, " is outside the vocabulary [0, ",
             info.vocab_size, ")");
  }
  p.sampling.validate();
  const auto prompt_len = static_cast<int64_t>(p.prompt.size());
  R3_CHECK(p.max_new_tokens >= 1, "max new tokens must be >= 1, got ", p.max_new_tokens);
  R3_CHECK(p.max_new_tokens <= options_.max_model_len - prompt_len, "the prompt has ", prompt_len,
           " tokens and max new tokens is ", p.max_new_tokens, ": more than the max model length of ",
           options_.max_model_len, " positions");
  R3_CHECK(kv_->blocks_for(prompt_len + p.max_new_tokens) <= options_.kv_blocks, "the request needs ",
           kv_->blocks_for(prompt_len + p.max_new_tokens), " KV blocks, the pool has ", options_.kv_blocks);
  R3_CHECK(p.n >= 1 && p.n <= options_.scheduler.max_waiting, "n must be in [1, ", options_.scheduler.max_waiting,
           "], got ", p.n);
  R3_CHECK(p.logprobs >= -1 && p.logprobs <= std::min<int64_t>(info.vocab_size, 1024),
           "logprobs must be in [0, ", std::min<int64_t>(info.vocab_size, 1024), "], got ", p.logprobs);
  R3_CHECK(p.routed_experts_start >= 0, "routed experts start must be >= 0, got ", p.routed_experts_start);
  if (!p.forced_routing.empty()) {
    R3_CHECK(per_row_ > 0 && static_cast<int64_t>(p.forced_routing.size()) % per_row_ == 0,
             "the replayed routing has ", p.forced_routing.size(), " ids, not a multiple of ",
             info.moe_layers.size(), " MoE layers x top-", info.top_k);
    const auto rows = static_cast<int64_t>(p.forced_routing.size()) / per_row_;
    R3_CHECK(rows >= prompt_len, "the replayed routing has ", rows, " rows, fewer than the ", prompt_len,
             " prompt tokens");
    for (const int32_t id : p.forced_routing) {
      R3_CHECK(id >= 0 && id < info.num_experts, "the replayed routing has expert id ", id, " outside [0, ",
               info.num_experts, ")");
    }
  }
  R3_CHECK(scheduler_->can_queue(p.n), "the waiting queue is full (", scheduler_->waiting().size(), " of ",
           options_.scheduler.max_waiting, " samples): retry later");
}

void RankEngine::submit(RequestParams params, RequestId id) {
  check_request(params);
  R3_CHECK(!requests_.contains(id), "request id ", id, " is already in use");
  Request& r = requests_[id];
  r.params = std::make_shared<const RequestParams>(std::move(params));
  for (int64_t i = 0; i < r.params->n; ++i) {
    r.samples.push_back(std::make_unique<Sequence>(id, i, r.params, per_row_));
    r.samples.back()->pending.index = i;
    scheduler_->enqueue(r.samples.back().get());
  }
}

void RankEngine::abort(RequestId id, const std::string& message) {
  auto it = requests_.find(id);
  if (it != requests_.end()) it->second.abort_message = message.empty() ? "aborted" : message;
}

void RankEngine::finish(Sequence& s, FinishReason reason, const std::string& message) {
  s.finish = reason;
  s.pending.finish = reason;
  s.pending.abort_message = message;
  s.pending.cached_prompt_tokens = s.cached_prompt_tokens;
  const int64_t start = std::min(s.params->routed_experts_start, s.routed_rows());
  if (s.params->return_routed_experts) {
    s.pending.routed_experts.assign(s.rows.begin() + start * per_row_, s.rows.end());
  }
  if (s.params->return_routing_margins) {
    const auto layers = static_cast<int64_t>(model_.info().moe_layers.size());
    s.pending.routing_margins.assign(s.margins.begin() + start * layers, s.margins.end());
  }
  if (s.params->return_routed_experts || s.params->return_routing_margins) s.pending.routed_rows = s.routed_rows() - start;
  scheduler_->remove(&s);
}

void RankEngine::sample(Sequence& s, const ops::DrawnToken& drawn) {
  const models::ModelInfo& info = model_.info();
  if (drawn.nonfinite_token >= 0) {
    finish(s, FinishReason::kAbort,
           detail::concat("the model produced a non-finite logit (", drawn.nonfinite_value, ") for token ",
                          drawn.nonfinite_token, " at position ", s.computed - 1,
                          ": the checkpoint holds NaN or infinite weights, or activations overflowed"));
    return;
  }
  const int32_t token = drawn.token;
  const RequestParams& p = *s.params;
  if (p.logprobs >= 0) {
    s.pending.logprobs.push_back(drawn.logprob);
    if (p.logprobs > 0) s.pending.top_logprobs.push_back(drawn.top);
  }
  s.tokens.push_back(token);
  s.pending.token_ids.push_back(token);
  const bool stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end() ||
                    (!p.ignore_eos &&
                     std::find(info.eos_token_ids.begin(), info.eos_token_ids.end(), token) != info.eos_token_ids.end());
  if (stop) {
    s.pending.matched_stop = token;
    finish(s, FinishReason::kStop);
  } else if (s.outputs() >= p.max_new_tokens) {
    finish(s, FinishReason::kLength);
  } else if (!p.forced_routing.empty() &&
             static_cast<int64_t>(s.tokens.size()) - 1 >= static_cast<int64_t>(p.forced_routing.size()) / per_row_) {
    const int64_t next_row = static_cast<int64_t>(s.tokens.size()) - 1;
    finish(s, FinishReason::kAbort,
           detail::concat("generation went past the replayed routing: token ", next_row, " needs row ", next_row,
                          ", the replay has ", p.forced_routing.size() / static_cast<std::size_t>(per_row_),
                          " rows (the replayed run ended there, e.g. at EOS)"));
  }
}

std::vector<RequestOutput> RankEngine::step() {
  const auto start = std::chrono::steady_clock::now();
  for (auto& [id, r] : requests_) {
    if (r.abort_message.empty()) continue;
    for (auto& s : r.samples) {
      if (!s->finished()) finish(*s, FinishReason::kAbort, r.abort_message);
    }
  }
  const std::vector<ScheduledChunk> chunks = scheduler_->schedule();
  if (!chunks.empty()) {
    const models::ModelInfo& info = model_.info();
    std::vector<StepSequence> seqs;
    std::vector<RoutedExperts> routed(chunks.size(), RoutedExperts(static_cast<int64_t>(info.moe_layers.size()),
                                                                   info.top_k));
    bool all_logits = false;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      Sequence& s = *chunks[i].sequence;
      kv_->prepare(s);
      const auto first = s.tokens.begin() + s.computed;
      StepSequence step{s.slot, std::vector<int32_t>(first, first + chunks[i].tokens), &routed[i], {}};
      if (!s.params->forced_routing.empty()) {
        const auto from = s.params->forced_routing.begin() + s.computed * per_row_;
        step.forced.assign(from, from + chunks[i].tokens * per_row_);
      }
      all_logits = all_logits || (s.params->prompt_logprobs && s.index == 0 && s.computed < s.prompt_len - 1);
      seqs.push_back(std::move(step));
    }
    // The draw of each sequence this step ends the prompt or decode of (taken from its sampler
    // now, whether the device or the host draws).
    std::vector<ops::TokenDraw> draws(chunks.size());
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const Sequence& s = *chunks[i].sequence;
      ops::TokenDraw& d = draws[i];
      d.draws = s.computed + chunks[i].tokens == static_cast<int64_t>(s.tokens.size());
      if (!d.draws) continue;
      const SamplingParams& sp = s.sampler.params();
      d.temperature = sp.temperature;
      d.top_k = sp.top_k;
      d.top_p = sp.top_p;
      d.min_p = sp.min_p;
      d.uniform = sp.temperature == 0.0 ? 0.0 : chunks[i].sequence->sampler.draw();
      d.logprobs = s.params->logprobs;
    }
    std::vector<ops::DrawnToken> drawn;
    Tensor logits;
    if (all_logits) {
      logits = runner_->run(std::move(seqs), 0, true);
      drawn.resize(chunks.size());  // drawn below from each chunk's last row
    } else {
      drawn = runner_->run_drawn(std::move(seqs), draws);
    }
    const auto routed_start = std::chrono::steady_clock::now();
    const int64_t vocab = info.vocab_size;
    int64_t row = 0;  // first logits row of chunk i when all_logits
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      Sequence& s = *chunks[i].sequence;
      const int64_t first = s.computed, n = chunks[i].tokens;
      kv_->computed(s, first, n, routed[i].flat().data(), routed[i].margins().data());
      Request& r = requests_.at(s.request);
      if (all_logits && s.params->prompt_logprobs && s.index == 0) {
        std::vector<float> lp(static_cast<std::size_t>(vocab));
        for (int64_t p = first; p < first + n && p + 1 < s.prompt_len; ++p) {
          if (p != static_cast<int64_t>(r.prompt_logprobs.size())) continue;
          log_softmax({logits.data<float>() + (row + p - first) * vocab, static_cast<std::size_t>(vocab)}, lp);
          r.prompt_logprobs.push_back(lp[static_cast<std::size_t>(s.tokens[static_cast<std::size_t>(p + 1)])]);
        }
      }
      if (all_logits && draws[i].draws) {
        drawn[i] = draw_on_host({logits.data<float>() + (row + n - 1) * vocab, static_cast<std::size_t>(vocab)}, draws[i]);
      }
      const bool decode = n == 1 && s.outputs() > 0 && first == static_cast<int64_t>(s.tokens.size()) - 1;
      (decode ? stats_.decode_tokens : stats_.prompt_tokens_computed) += n;
      if (s.uncomputed() == 0) sample(s, drawn[i]);
      row += n;
    }
    stats_.routed_seconds += seconds_since(routed_start);
    ++stats_.steps;
    stats_.batch_sequences_sum += static_cast<int64_t>(chunks.size());
    stats_.max_batch_sequences = std::max(stats_.max_batch_sequences, static_cast<int64_t>(chunks.size()));
  } else if (dispatcher_ != nullptr) {
    runner_->run_idle();  // the other ranks' tokens still need this rank's experts
  }
  std::vector<RequestOutput> outputs = collect_outputs();
  const double took = seconds_since(start);
  stats_.step_seconds += took;
  stats_.max_step_seconds = std::max(stats_.max_step_seconds, took);
  return outputs;
}

std::vector<RequestOutput> RankEngine::collect_outputs() {
  std::vector<RequestOutput> outputs;
  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& r = it->second;
    RequestOutput out;
    out.id = it->first;
    const bool prompt_done = static_cast<int64_t>(r.prompt_logprobs.size()) ==
                             static_cast<int64_t>(r.params->prompt.size()) - 1;
    if (r.params->prompt_logprobs && prompt_done && !r.prompt_logprobs_sent) {
      out.prompt_logprobs = r.prompt_logprobs;
      r.prompt_logprobs_sent = true;
    }
    bool all_finished = true;
    for (auto& s : r.samples) {
      all_finished = all_finished && s->finished();
      if (s->pending.token_ids.empty() && s->pending.finish == FinishReason::kNone) continue;
      out.samples.push_back(std::move(s->pending));
      s->pending = SampleOutput{};
      s->pending.index = s->index;
    }
    out.finished = all_finished;
    if (!out.samples.empty() || !out.prompt_logprobs.empty()) outputs.push_back(std::move(out));
    it = all_finished ? requests_.erase(it) : std::next(it);
  }
  return outputs;
}

EngineStats RankEngine::stats() const {
  EngineStats s = stats_;
  s.prefix_blocks_looked_up = kv_->pool().stats().lookups;
  s.prefix_blocks_hit = kv_->pool().stats().hits;
  s.preemptions = scheduler_->preemptions();
  s.kv_blocks_total = kv_->pool().num_blocks();
  s.kv_blocks_free = kv_->pool().num_free();
  s.running = static_cast<int64_t>(scheduler_->running().size());
  s.waiting = static_cast<int64_t>(scheduler_->waiting().size());
  return s;
}

}  // namespace r3::engine
