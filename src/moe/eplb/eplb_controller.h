// Runs EPLB for a model: advances every MoE layer's load window each step and, every
// `rebalance_every` steps, plans a new placement from the measured loads and moves the expert
// weights there. Outputs and captured (logical) ids do not change with placement.
#pragma once

#include <vector>

#include "moe/eplb/rebalance.h"
#include "moe/physical_experts.h"

namespace r3::moe {

struct EplbOptions {
  int64_t redundant_experts = 0;  // extra physical slots per MoE layer
  int64_t window_steps = 10;      // load window
  int64_t rebalance_every = 0;    // steps; 0 = never
  EplbTopology topology;

  void validate() const;
};

class EplbController {
 public:
  EplbController(EplbOptions options, std::vector<PhysicalExperts*> layers);

  // Call after every forward step.
  void end_step();
  int64_t rebalances() const { return rebalances_; }
  const EplbOptions& options() const { return options_; }

 private:
  EplbOptions options_;
  std::vector<PhysicalExperts*> layers_;
  int64_t steps_ = 0;
  int64_t rebalances_ = 0;
};

}  // namespace r3::moe
