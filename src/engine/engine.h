// The serving engine: many requests at once over one model, each getting exactly the routing its
// tokens were computed with. Callers submit requests, call step() until has_work() is false (or
// forever, in a server), and read each request's outputs as they stream out of step(); abort()
// ends a request at any time. The CLI and the HTTP server use only this API.
//
// The engine is one or more ranks (engine/rank_engine.h). With EngineOptions::expert_parallel = N
// > 1 it runs N expert-parallel ranks as threads over an in-process transport (moe/ep; on GPUs,
// a rank per device, each with its own placed model holding its slice of the experts,
// exchanging over device memory by NCCL or in-process copies): each rank
// takes its share of the requests (the one with the fewest unfinished requests gets the next)
// with its own scheduler and KV cache, captures its tokens' logical ids before they leave it, and
// runs the routed experts of its slice of the physical experts for every rank's tokens. Every
// rank steps together (a rank without sequences on a padding row), and EPLB plans from the loads
// of all ranks, between steps, and moves the experts' weights between the ranks. The outputs,
// tokens and routed experts are those of one rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/context.h"
#include "engine/engine_options.h"
#include "engine/rank_engine.h"
#include "engine/request.h"
#include "models/causal_lm.h"
#include "moe/eplb/eplb_controller.h"

namespace r3::moe::ep {
class InProcessGroup;
class ExpertParallelDispatcher;
class DeviceExchangeGroup;
}  // namespace r3::moe::ep

namespace r3::engine {

// An expert-parallel rank's own context and model, on a GPU: unlike CPU ranks, which share one
// model, each GPU rank needs a model placed for it (a device model keeps per-step state of its
// own: graphs, step buffers, the capture buffer).
struct PlacedRank {
  std::unique_ptr<backend::Context> ctx;
  std::unique_ptr<models::CausalLM> model;
};
using PlaceRank = std::function<PlacedRank(int rank)>;

class Engine {
 public:
  // ctx: where a single rank runs. Expert-parallel ranks on the CPU get a context each, splitting
  // ctx's threads between them, and share `model`; on a GPU (ctx a CUDA context) rank 0 runs
  // `model` on ctx and place_rank(r) makes rank r's context and model.
  Engine(models::CausalLM& model, backend::Context& ctx, EngineOptions options = {}, const PlaceRank& place_rank = {});
  ~Engine();

  // Validates and queues a request (all its samples); throws r3::Error with a one-line reason
  // (bad ids, lengths beyond the model, replay rows, a full waiting queue).
  RequestId submit(RequestParams params);
  // Ends a request: its unfinished samples finish with kAbort at the next step's outputs.
  // Unknown or finished ids are ignored.
  void abort(RequestId id, const std::string& message = "aborted");
  // Runs one step (if anything can run) and returns what each request produced in it.
  std::vector<RequestOutput> step();
  bool has_work() const;

  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  // Why prefix caching is off for this model, or empty.
  const std::string& prefix_caching_off_reason() const { return ranks_.front().engine->prefix_caching_off_reason(); }
  const models::CausalLM& model() const { return model_; }

 private:
  struct Rank {
    std::unique_ptr<backend::Context> own_ctx;  // expert parallelism: the rank's threads and workspace
    std::unique_ptr<models::CausalLM> own_model;  // a GPU rank after the first: its placed model
    std::unique_ptr<moe::ep::ExpertParallelDispatcher> dispatcher;
    std::unique_ptr<RankEngine> engine;
  };
  // Runs work(r) for every rank r at once, rank 0 on this thread and the others on threads of
  // their own. If ranks throw, the group is reset and the first rank's error is rethrown (the
  // others failed because it aborted the group).
  void on_every_rank(const std::function<void(int rank)>& work);
  // Every rank's step.
  std::vector<RequestOutput> step_ranks();
  // Sums the ranks' loads of the step just run into the group's EPLB window.
  void end_group_step();
  // EPLB's re-placement of one layer across the ranks: each changed slot's weights travel from a
  // rank holding them to the slot's rank (moe/ep/expert_moves.h), then the layer takes them.
  void move_experts_between_ranks(moe::PhysicalExperts& layer, moe::ExpertPlacement placement);
  // The same on GPU ranks, each of which has a host model of its own over the mapped checkpoint:
  // every rank's host layer takes the placement (its bookkeeping: the host reads no weights), and
  // before their next step the ranks' device layers move the changed slots' weights between
  // their GPUs, over the device exchange (moe/ep/device_expert_moves.h).
  void rearrange_every_rank(moe::PhysicalExperts& layer, moe::ExpertPlacement placement);

  models::CausalLM& model_;
  EngineOptions options_;
  std::unique_ptr<moe::ep::InProcessGroup> group_;
  std::vector<Rank> ranks_;
  std::unique_ptr<moe::ep::DeviceExchangeGroup> device_group_;  // GPU ranks: the all-to-all over device memory
  std::vector<int32_t> owners_;  // expert parallelism: the rank of each physical expert (slot)
  int64_t weight_bytes_moved_ = 0;
  std::optional<moe::EplbController> eplb_;  // the group's, under expert parallelism
  std::optional<moe::ExpertLoads> group_loads_;
  RequestId next_id_ = 0;
  int64_t group_steps_ = 0;
  int64_t group_max_sequences_ = 0;  // most sequences of all ranks in one step
  double group_seconds_ = 0;
  double group_max_step_seconds_ = 0;
};

}  // namespace r3::engine
