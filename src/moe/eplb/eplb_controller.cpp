#include "moe/eplb/eplb_controller.h"

#include <spdlog/spdlog.h>

#include "core/check.h"

namespace r3::moe {

void EplbOptions::validate() const {
  R3_CHECK(redundant_experts >= 0, "--eplb-redundant-experts must be >= 0, got ", redundant_experts);
  R3_CHECK(window_steps >= 1, "--eplb-window must be >= 1, got ", window_steps);
  R3_CHECK(rebalance_every >= 0, "--eplb-rebalance-every must be >= 0, got ", rebalance_every);
}

EplbController::EplbController(EplbOptions options, std::vector<PhysicalExperts*> layers)
    : options_(options), layers_(std::move(layers)) {
  options_.validate();
  // The topology only matters at the first rebalance, but a shape that cannot be placed is a
  // bad option: refuse it now, before any token runs, not steps into the run.
  for (const PhysicalExperts* layer : layers_) {
    validate_topology(options_.topology, layer->num_logical(), layer->num_physical());
  }
}

void EplbController::end_step() {
  ++steps_;
  if (options_.rebalance_every > 0 && steps_ % options_.rebalance_every == 0) {
    for (PhysicalExperts* layer : layers_) {
      const std::vector<double> load = layer->logical_load();
      const EplbPlan plan = plan_placement(load, layer->num_physical(), options_.topology);
      const double before = placement_balance(layer->placement().physical_to_logical(), load,
                                              options_.topology.num_gpus).imbalance();
      const double after = placement_balance(plan.physical_to_logical, load, options_.topology.num_gpus).imbalance();
      layer->rearrange(ExpertPlacement(plan.physical_to_logical, layer->num_logical()));
      spdlog::debug("EPLB step {}: max/mean GPU load {:.3f} -> {:.3f}", steps_, before, after);
    }
    ++rebalances_;
  }
  for (PhysicalExperts* layer : layers_) layer->end_step();
}

}  // namespace r3::moe
