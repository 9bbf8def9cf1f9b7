#include "moe/eplb/eplb_controller.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/check.h"

namespace r3::moe {

void EplbOptions::validate() const {
  R3_CHECK(redundant_experts >= 0, "--eplb-redundant-experts must be >= 0, got ", redundant_experts);
  R3_CHECK(window_steps >= 1 && window_steps <= kMaxWindowSteps, "--eplb-window must be in [1, ", kMaxWindowSteps,
           "] steps, got ", window_steps);
  R3_CHECK(rebalance_every >= 0, "--eplb-rebalance-every must be >= 0, got ", rebalance_every);
  R3_CHECK(layers_per_step >= 0, "--eplb-layers-per-step must be >= 0, got ", layers_per_step);
}

void EplbOptions::validate(int64_t num_experts) const {
  validate();
  R3_CHECK(redundant_experts <= kMaxReplicaFactor * num_experts, "--eplb-redundant-experts must be at most ",
           kMaxReplicaFactor, " x the model's ", num_experts, " experts (", kMaxReplicaFactor * num_experts,
           "), got ", redundant_experts);
}

EplbController::EplbController(EplbOptions options, std::vector<PhysicalExperts*> layers, MoveExperts move)
    : options_(options), layers_(std::move(layers)), move_(std::move(move)) {
  options_.validate();
  if (!move_) move_ = [](PhysicalExperts& layer, ExpertPlacement placement) { layer.rearrange(std::move(placement)); };
  // The topology only matters at the first rebalance, but a shape that cannot be placed is a
  // bad option: refuse it now, before any token runs, not steps into the run.
  for (const PhysicalExperts* layer : layers_) {
    validate_topology(options_.topology, layer->num_logical(), layer->num_physical());
    windows_.emplace_back(layer->num_physical(), options_.window_steps);
  }
}

void EplbController::end_step(const ExpertLoads& step) {
  R3_CHECK(step.num_layers() == static_cast<int64_t>(layers_.size()), "EPLB: loads of ", step.num_layers(),
           " MoE layers for ", layers_.size());
  for (std::size_t j = 0; j < layers_.size(); ++j) {
    const auto counts = step.layer(static_cast<int64_t>(j));
    for (std::size_t p = 0; p < counts.size(); ++p) windows_[j].add(static_cast<int32_t>(p), counts[p]);
  }
  ++steps_;
  if (options_.rebalance_every > 0 && steps_ % options_.rebalance_every == 0) {
    if (waiting_.empty()) plan();
    else spdlog::debug("EPLB step {}: {} layers of the last rebalance still to move; this one is skipped", steps_, waiting_.size());
  }
  move_waiting_layers();
  for (LoadWindow& window : windows_) window.end_step();
}

void EplbController::plan() {
  for (std::size_t j = 0; j < layers_.size(); ++j) {
    const PhysicalExperts* layer = layers_[j];
    const std::vector<double> load = layer->logical_load(windows_[j].totals());
    const EplbPlan plan = plan_placement(load, layer->num_physical(), options_.topology);
    const double before = placement_balance(layer->placement().physical_to_logical(), load,
                                            options_.topology.num_gpus).imbalance();
    const double after = placement_balance(plan.physical_to_logical, load, options_.topology.num_gpus).imbalance();
    spdlog::debug("EPLB step {}, MoE layer {}: max/mean GPU load {:.3f} -> {:.3f}", steps_, j, before, after);
    // The same balance, with as many experts as possible staying on their GPU and in their slot.
    std::vector<int32_t> placed =
        keep_in_place(layer->placement().physical_to_logical(), plan.physical_to_logical, options_.topology);
    waiting_.emplace_back(j, ExpertPlacement(std::move(placed), layer->num_logical()));
  }
  ++rebalances_;
}

void EplbController::move_waiting_layers() {
  const std::size_t n = options_.layers_per_step == 0
                            ? waiting_.size()
                            : std::min(waiting_.size(), static_cast<std::size_t>(options_.layers_per_step));
  for (std::size_t i = 0; i < n; ++i) {
    auto [j, placement] = std::move(waiting_.front());
    waiting_.pop_front();
    move_(*layers_[j], std::move(placement));
    windows_[j].reset();  // its counts refer to the old placement
  }
}

}  // namespace r3::moe
