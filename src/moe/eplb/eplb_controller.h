// Runs EPLB for a model, on the engine's side: adds each step's expert loads (counted by the EPLB
// map, padding rows excluded) to every MoE layer's load window and, every `rebalance_every` steps,
// plans a new placement from the window and moves the expert weights there. Outputs and captured
// (logical) ids do not change with placement.
#pragma once

#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "moe/eplb/load_window.h"
#include "moe/eplb/rebalance.h"
#include "moe/expert_loads.h"
#include "moe/physical_experts.h"

namespace r3::moe {

// A load window keeps one count per physical expert, step and MoE layer; vLLM's default window
// is 1000 steps.
inline constexpr int64_t kMaxWindowSteps = 100000;
// Replicas beyond a few per expert balance nothing more (a replica halves at most its expert's
// load) and each one is a copy of the expert's weights in memory.
inline constexpr int64_t kMaxReplicaFactor = 4;

struct EplbOptions {
  int64_t redundant_experts = 0;  // extra physical experts (replicas) per MoE layer
  int64_t window_steps = 10;      // load window
  int64_t rebalance_every = 0;    // steps; 0 = never
  // MoE layers whose experts move after each step once a rebalance is planned; 0 = all at once.
  // Spreading a rebalance over steps bounds what one step waits for (a layer's weights), while
  // the layers not yet moved serve on with their old placement (SGLang's layers per chunk).
  int64_t layers_per_step = 0;
  EplbTopology topology;

  // The window is at most kMaxWindowSteps; with the model's experts: redundant_experts at most
  // kMaxReplicaFactor x num_experts.
  void validate() const;
  void validate(int64_t num_experts) const;
  // Replicas or rebalancing asked for.
  bool active() const { return redundant_experts > 0 || rebalance_every > 0; }
};

class EplbController {
 public:
  // How a new placement reaches a layer's weights: by default PhysicalExperts::rearrange (this
  // process holds every expert); an expert-parallel group moves them between its ranks.
  using MoveExperts = std::function<void(PhysicalExperts& layer, ExpertPlacement placement)>;

  EplbController(EplbOptions options, std::vector<PhysicalExperts*> layers, MoveExperts move = {});

  // Call after every forward step with its loads.
  void end_step(const ExpertLoads& step);
  // Rebalances planned. A rebalance falling due while the last one's layers are still moving
  // is skipped.
  int64_t rebalances() const { return rebalances_; }
  // Layers of the last rebalance whose experts have not moved yet.
  int64_t layers_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const EplbOptions& options() const { return options_; }

 private:
  void plan();
  void move_waiting_layers();

  EplbOptions options_;
  std::vector<PhysicalExperts*> layers_;
  MoveExperts move_;
  std::vector<LoadWindow> windows_;  // per MoE layer, per physical expert
  std::deque<std::pair<std::size_t, ExpertPlacement>> waiting_;  // planned, not moved yet, in layer order
  int64_t steps_ = 0;
  int64_t rebalances_ = 0;
};

}  // namespace r3::moe
