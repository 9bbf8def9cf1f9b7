// The serving engine: many requests at once over one model, each getting exactly the routing its
// tokens were computed with. Callers submit requests, call step() until has_work() is false (or
// forever, in a server), and read each request's outputs as they stream out of step(); abort()
// ends a request at any time. The CLI and the HTTP server use only this API.
//
// The engine owns its requests, the scheduler, the model cache and its blocks (KvManager) and a
// StepRunner with its own capture buffer: two engines over one model do not interfere, except
// through EPLB, which moves the model's experts (see StepRunner).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/context.h"
#include "engine/kv_manager.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_runner.h"
#include "models/causal_lm.h"

namespace r3::engine {

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t block_size = 16;
  // KV blocks in the pool; 0: enough for max_running sequences of max_model_len positions.
  int64_t kv_blocks = 0;
  // Positions per sequence (prompt + outputs); 0: the model's max_position_embeddings.
  int64_t max_model_len = 0;
  bool prefix_caching = true;  // turned off (with a start-up message) where the cache cannot share
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens_computed = 0;  // prefill and recompute tokens run
  int64_t decode_tokens = 0;           // one-token steps of sequences that had sampled
  int64_t max_batch_sequences = 0;
  int64_t batch_sequences_sum = 0;     // / steps: mean sequences per step
  int64_t prefix_blocks_looked_up = 0, prefix_blocks_hit = 0;
  int64_t preemptions = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0;
  double step_seconds = 0;
  double routed_seconds = 0;  // handling routed rows after the model step (the capture's host side)
  int64_t running = 0, waiting = 0;
};

class Engine {
 public:
  Engine(models::CausalLM& model, backend::Context& ctx, EngineOptions options = {});
  ~Engine();

  // Validates and queues a request (all its samples); throws r3::Error with a one-line reason
  // (bad ids, lengths beyond the model, replay rows, a full waiting queue).
  RequestId submit(RequestParams params);
  // Ends a request: its unfinished samples finish with kAbort at the next step's outputs.
  // Unknown or finished ids are ignored.
  void abort(RequestId id, const std::string& message = "aborted");
  // Runs one step (if anything can run) and returns what each request produced in it.
  std::vector<RequestOutput> step();
  bool has_work() const { return !requests_.empty(); }

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
  backend::Context& ctx_;
  EngineOptions options_;
  std::string prefix_off_reason_;
  int64_t per_row_;
  std::unique_ptr<models::ModelCache> cache_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<StepRunner> runner_;
  std::map<RequestId, Request> requests_;
  RequestId next_id_ = 0;
  EngineStats stats_;
};

}  // namespace r3::engine
