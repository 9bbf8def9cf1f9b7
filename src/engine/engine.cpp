#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "core/check.h"
#include "moe/ep/device_exchange.h"
#include "moe/ep/expert_moves.h"
#include "moe/ep/expert_parallel_dispatcher.h"
#include "moe/ep/in_process_transport.h"

namespace r3::engine {

namespace {

// More ranks than this is a typo, not a machine (the largest expert-parallel deployments run 64
// to 320 GPUs, as separate processes).
constexpr int kMaxExpertParallel = 64;

// The model's MoE layers must have one physical expert count for the ranks to split them alike.
int64_t physical_experts_per_layer(models::CausalLM& model, int ranks) {
  const std::vector<moe::MoeBlock*> blocks = model.moe_blocks();
  R3_CHECK(!blocks.empty(), "--ep ", ranks, ": the model has no MoE layers to spread over ranks");
  const int64_t physical = blocks.front()->experts().num_physical();
  for (const moe::MoeBlock* b : blocks) {
    R3_CHECK(b->experts().num_physical() == physical, "--ep ", ranks, ": MoE layers with ", physical, " and ",
             b->experts().num_physical(), " physical experts cannot be split alike over ranks");
  }
  R3_CHECK(physical >= ranks, "--ep ", ranks, ": each rank needs at least one of the ", physical,
           " physical experts of a MoE layer");
  return physical;
}

}  // namespace

void EngineStats::add_rank(const EngineStats& r) {
  steps += r.steps;
  prompt_tokens_computed += r.prompt_tokens_computed;
  decode_tokens += r.decode_tokens;
  batch_sequences_sum += r.batch_sequences_sum;
  prefix_blocks_looked_up += r.prefix_blocks_looked_up;
  prefix_blocks_hit += r.prefix_blocks_hit;
  preemptions += r.preemptions;
  kv_blocks_total += r.kv_blocks_total;
  kv_blocks_free += r.kv_blocks_free;
  step_seconds += r.step_seconds;
  routed_seconds = std::max(routed_seconds, r.routed_seconds);  // the ranks handle theirs at once
  max_step_seconds = std::max(max_step_seconds, r.max_step_seconds);
  running += r.running;
  waiting += r.waiting;
  expert_rows_exchanged += r.expert_rows_exchanged;
}

Engine::Engine(models::CausalLM& model, backend::Context& ctx, EngineOptions options, const PlaceRank& place_rank)
    : model_(model), options_(options) {
  const int n = options_.expert_parallel;
  R3_CHECK(n >= 1 && n <= kMaxExpertParallel, "--ep must be in [1, ", kMaxExpertParallel, "], got ", n);
  if (n == 1) {
    ranks_.emplace_back().engine = std::make_unique<RankEngine>(model, ctx, options_);
    options_ = ranks_.front().engine->options();  // with the pool size it chose
    return;
  }
  const bool on_gpu = ctx.device() != Device::kCpu;
  R3_CHECK(!on_gpu || place_rank, "--ep ", n, " on a GPU: every rank needs a model placed for it");
  const int64_t physical = physical_experts_per_layer(model, n);
  if (model.eplb_options().active()) {
    // The rebalancer balances each GPU's load; here the ranks are those GPUs.
    moe::EplbOptions eplb = model.eplb_options();
    if (eplb.topology.num_gpus == 1) eplb.topology.num_gpus = n;
    R3_CHECK(eplb.topology.num_gpus == n, "--ep ", n, " with --eplb-gpus ", eplb.topology.num_gpus,
             ": EPLB places the experts on the expert-parallel ranks, so the two must match");
    std::vector<moe::PhysicalExperts*> layers;
    std::vector<int64_t> widths;
    for (moe::MoeBlock* b : model.moe_blocks()) {
      layers.push_back(&b->experts());
      widths.push_back(b->experts().num_physical());
    }
    eplb_.emplace(eplb, std::move(layers), [this, on_gpu](moe::PhysicalExperts& layer, moe::ExpertPlacement placement) {
      if (on_gpu) rearrange_every_rank(layer, std::move(placement));
      else move_experts_between_ranks(layer, std::move(placement));
    });
    group_loads_.emplace(widths);
  }
  group_ = std::make_unique<moe::ep::InProcessGroup>(n);
  owners_ = moe::ep::contiguous_owners(physical, n);
  const int threads = std::max(1, ctx.threads().size() / n);
  // Each rank's context and model first: GPU ranks exchange over device memory between their
  // contexts (moe/ep/device_exchange.h).
  std::vector<backend::Context*> contexts;
  std::vector<models::CausalLM*> models;
  for (int r = 0; r < n; ++r) {
    Rank& rank = ranks_.emplace_back();
    if (!on_gpu) {
      rank.own_ctx = std::make_unique<backend::Context>(threads);
    } else if (r > 0) {
      PlacedRank placed = place_rank(r);
      R3_CHECK(placed.ctx && placed.model && placed.model->info().num_experts == model.info().num_experts,
               "--ep ", n, ": rank ", r, " was not placed with the model's experts");
      rank.own_ctx = std::move(placed.ctx);
      rank.own_model = std::move(placed.model);
    }
    contexts.push_back(rank.own_ctx ? rank.own_ctx.get() : &ctx);
    models.push_back(rank.own_model ? rank.own_model.get() : &model);
  }
  if (on_gpu) device_group_ = moe::ep::make_device_exchange_group(contexts);
  for (int r = 0; r < n; ++r) {
    Rank& rank = ranks_[static_cast<std::size_t>(r)];
    moe::ep::DeviceExchange* device = device_group_ ? &device_group_->rank(r) : nullptr;
    rank.dispatcher = std::make_unique<moe::ep::ExpertParallelDispatcher>(group_->rank(r), owners_, device);
    rank.engine = std::make_unique<RankEngine>(*models[static_cast<std::size_t>(r)], *contexts[static_cast<std::size_t>(r)],
                                               options_, rank.dispatcher.get());
  }
  options_ = ranks_.front().engine->options();
  options_.expert_parallel = n;
}

Engine::~Engine() = default;

RequestId Engine::submit(RequestParams params) {
  // Data-parallel attention: the rank with the fewest unfinished requests takes it, among those
  // with room in their waiting queue (if none has, that rank refuses it, saying so).
  const auto fewer = [&](const Rank& a, const Rank& b) {
    const bool room_a = a.engine->can_queue(params.n), room_b = b.engine->can_queue(params.n);
    if (room_a != room_b) return room_a;
    return a.engine->requests() < b.engine->requests();
  };
  const auto rank = std::min_element(ranks_.begin(), ranks_.end(), fewer);
  rank->engine->submit(std::move(params), next_id_);
  return next_id_++;
}

void Engine::abort(RequestId id, const std::string& message) {
  for (Rank& r : ranks_) r.engine->abort(id, message);  // only its rank knows it
}

bool Engine::has_work() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.engine->has_work(); });
}

std::vector<RequestOutput> Engine::step() {
  if (ranks_.size() == 1) return ranks_.front().engine->step();
  if (!has_work()) return {};
  const auto start = std::chrono::steady_clock::now();
  const auto sequences_run = [&] {
    int64_t n = 0;
    for (const Rank& r : ranks_) n += r.engine->stats().batch_sequences_sum;
    return n;
  };
  const int64_t before = sequences_run();
  std::vector<RequestOutput> outputs = step_ranks();
  end_group_step();
  ++group_steps_;
  group_max_sequences_ = std::max(group_max_sequences_, sequences_run() - before);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  group_seconds_ += took;
  group_max_step_seconds_ = std::max(group_max_step_seconds_, took);
  return outputs;
}

void Engine::on_every_rank(const std::function<void(int rank)>& work) {
  const int n = static_cast<int>(ranks_.size());
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  // The rank that failed first: its catch runs before it aborts the group, and the others fail
  // only once the group is aborted, so its error is the cause.
  std::atomic<int> first{-1};
  const auto run = [&](int r) {
    try {
      work(r);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      int none = -1;
      first.compare_exchange_strong(none, r);
      group_->rank(r).abort(e.what());  // the others stop waiting for this rank
      if (device_group_) device_group_->rank(r).abort(e.what());
    }
  };
  {
    std::vector<std::jthread> others;
    for (int r = 1; r < n; ++r) others.emplace_back(run, r);
    run(0);
  }
  if (first >= 0) {  // the group is made ready for the next collective
    group_->reset();
    if (device_group_) device_group_->reset();
    std::rethrow_exception(errors[static_cast<std::size_t>(first.load())]);
  }
}

std::vector<RequestOutput> Engine::step_ranks() {
  std::vector<std::vector<RequestOutput>> outputs(ranks_.size());
  // A failed step throws here; the next step's aborts end its requests.
  on_every_rank([&](int r) { outputs[static_cast<std::size_t>(r)] = ranks_[static_cast<std::size_t>(r)].engine->step(); });
  std::vector<RequestOutput> all;
  for (auto& mine : outputs) std::move(mine.begin(), mine.end(), std::back_inserter(all));
  return all;
}

void Engine::move_experts_between_ranks(moe::PhysicalExperts& layer, moe::ExpertPlacement placement) {
  const std::vector<moe::ep::ExpertMove> moves = moe::ep::plan_expert_moves(layer.placement(), placement, owners_);
  std::vector<moe::ep::ArrivedExperts> arrived(ranks_.size());
  // The ranks only read the layer here; it changes once all of them have returned.
  on_every_rank([&](int r) {
    arrived[static_cast<std::size_t>(r)] = moe::ep::move_expert_weights(group_->rank(r), layer, moves, owners_);
  });
  std::vector<std::pair<int32_t, moe::SwigluExpertWeights>> slots;
  for (moe::ep::ArrivedExperts& a : arrived) {
    weight_bytes_moved_ += a.bytes_received;
    std::move(a.slots.begin(), a.slots.end(), std::back_inserter(slots));
  }
  layer.rearrange(std::move(placement), std::move(slots));
}

void Engine::rearrange_every_rank(moe::PhysicalExperts& layer, moe::ExpertPlacement placement) {
  const std::vector<moe::MoeBlock*> first = model_.moe_blocks();
  const auto j = static_cast<std::size_t>(
      std::find_if(first.begin(), first.end(), [&](moe::MoeBlock* b) { return &b->experts() == &layer; }) - first.begin());
  R3_CHECK(j < first.size(), "EPLB: a layer that is not one of the model's MoE layers");
  // Rank 0's host model is model_ itself; the others' are their own (each maps the checkpoint).
  for (const Rank& r : ranks_) {
    if (r.own_model) r.own_model->moe_blocks()[j]->experts().rearrange(placement);
  }
  layer.rearrange(std::move(placement));
}

void Engine::end_group_step() {
  if (!eplb_) return;
  group_loads_->clear();
  for (const Rank& r : ranks_) {
    const moe::ExpertLoads& loads = r.engine->step_loads();
    for (int64_t j = 0; j < loads.num_layers(); ++j) {
      const std::span<int64_t> sum = group_loads_->layer(j);
      const std::span<const int64_t> mine = loads.layer(j);
      for (std::size_t p = 0; p < sum.size(); ++p) sum[p] += mine[p];
    }
  }
  eplb_->end_step(*group_loads_);  // may move the experts: no rank is running
}

EngineStats Engine::stats() const {
  if (ranks_.size() == 1) return ranks_.front().engine->stats();
  EngineStats s;
  for (const Rank& r : ranks_) {
    EngineStats rank = r.engine->stats();
    rank.expert_rows_exchanged = r.dispatcher->rows_sent_elsewhere();
    s.add_rank(rank);
  }
  s.expert_weight_bytes_moved = weight_bytes_moved_;
  s.steps = group_steps_;
  s.step_seconds = group_seconds_;
  s.max_step_seconds = group_max_step_seconds_;
  s.max_batch_sequences = group_max_sequences_;
  return s;
}

}  // namespace r3::engine
