// One rank of the serving engine (engine/engine.h): its requests, scheduler, model cache and
// blocks (KvManager), and a StepRunner with its own capture buffer. A single-rank engine is one
// RankEngine; under expert parallelism each rank is one, its MoE layers reaching the other ranks'
// experts through its dispatcher, and every rank steps whenever any has work (a step's
// all-to-alls are collectives), one without sequences on a padding row.
//
// Two engines over one model do not interfere, except through EPLB, which moves the model's
// experts (see StepRunner).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/context.h"
#include "engine/engine_options.h"
#include "engine/kv_manager.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_runner.h"
#include "models/causal_lm.h"

namespace r3::engine {

class RankEngine {
 public:
  // dispatcher: an expert-parallel rank's (the rank then always runs a step, and leaves EPLB to
  // the group: see StepRunner), or nullptr for a single rank.
  RankEngine(models::CausalLM& model, backend::Context& ctx, EngineOptions options,
             const moe::Dispatcher* dispatcher = nullptr);
  ~RankEngine();

  // Validates and queues a request (all its samples) under `id`, which the caller keeps unique;
  // throws r3::Error with a one-line reason (bad ids, lengths beyond the model, replay rows, a
  // full waiting queue).
  void submit(RequestParams params, RequestId id);
  // Ends a request: its unfinished samples finish with kAbort at the next step's outputs.
  // Unknown or finished ids are ignored.
  void abort(RequestId id, const std::string& message = "aborted");
  // Runs one step (if anything can run; with a dispatcher, always) and returns what each request
  // produced in it.
  std::vector<RequestOutput> step();
  bool has_work() const { return !requests_.empty(); }
  // Requests not yet finished.
  int64_t requests() const { return static_cast<int64_t>(requests_.size()); }
  // Whether the waiting queue has room for `samples` more.
  bool can_queue(int64_t samples) const { return scheduler_->can_queue(samples); }
  // The last step's tokens per physical expert (padding rows not counted).
  const moe::ExpertLoads& step_loads() const { return runner_->loads(); }

  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  // Why prefix caching is off for this model, or empty.
  const std::string& prefix_caching_off_reason() const { return prefix_off_reason_; }
  const models::CausalLM& model() const { return model_; }

 private:
  struct Request {
    std::shared_ptr<const RequestParams> params;
    std::vector<std::unique_ptr<Sequence>> samples;
    std::vector<float> prompt_logprobs;
    bool prompt_logprobs_sent = false;
    std::string abort_message;  // set by abort(): ends the samples at the next step
  };
  void check_request(const RequestParams& params) const;
  // Ends `s` with `reason`; its slot and blocks go back.
  void finish(Sequence& s, FinishReason reason, const std::string& message = "");
  // Takes the token drawn for `s` (or ends it on a non-finite logit), and ends it when a stop rule says so.
  void sample(Sequence& s, const ops::DrawnToken& drawn);
  std::vector<RequestOutput> collect_outputs();

  models::CausalLM& model_;
  EngineOptions options_;
  const moe::Dispatcher* dispatcher_;
  std::string prefix_off_reason_;
  int64_t per_row_;
  std::unique_ptr<models::ModelCache> cache_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<StepRunner> runner_;
  std::map<RequestId, Request> requests_;
  EngineStats stats_;
};

}  // namespace r3::engine
