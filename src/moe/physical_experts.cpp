#include "moe/physical_experts.h"


#include "ops/activation.h"

namespace r3::moe {

namespace {

Tensor copy_if_defined(const Tensor& t) { return t.defined() ? contiguous_copy(t) : Tensor(); }

}  // namespace

SwigluExpertWeights copy_expert(const SwigluExpertWeights& w) {
  return {contiguous_copy(w.gate), contiguous_copy(w.up), contiguous_copy(w.down), copy_if_defined(w.gate_bias),
          copy_if_defined(w.up_bias), copy_if_defined(w.down_bias)};
}

PhysicalExperts::PhysicalExperts(std::vector<SwigluExpertWeights> logical, ExpertPlacement placement,
                                 ExpertActivation activation)
    : placement_(std::move(placement)), activation_(activation) {
  R3_CHECK(!logical.empty(), "an MoE layer needs at least one expert");
  R3_CHECK(static_cast<int64_t>(logical.size()) == placement_.num_logical(), "placement covers ",
           placement_.num_logical(), " experts, the layer has ", logical.size());
  // Shapes of the values: an MXFP4 matrix holds two per stored byte.
  intermediate_ = value_shape(logical[0].gate)[0];
  hidden_ = value_shape(logical[0].gate)[1];
  for (const auto& e : logical) {
    R3_CHECK(value_shape(e.gate) == Shape({intermediate_, hidden_}) && value_shape(e.up) == value_shape(e.gate) &&
                 value_shape(e.down) == Shape({hidden_, intermediate_}),
             "experts of one layer must share their shapes");
  }
  const bool identity = placement_.num_physical() == placement_.num_logical() &&
                        [&] {
                          for (int32_t p = 0; p < placement_.num_physical(); ++p) {
                            if (placement_.logical_of(p) != p) return false;
                          }
                          return true;
                        }();
  if (identity) {
    physical_ = std::move(logical);  // no EPLB: the checkpoint's tensors, zero-copy
  } else {
    for (int32_t p = 0; p < placement_.num_physical(); ++p) {
      physical_.push_back(copy_expert(logical[static_cast<std::size_t>(placement_.logical_of(p))]));
    }
  }
  build_bank();
}

PhysicalRouting PhysicalExperts::map(backend::Workspace& workspace, const CapturedRouting& captured,
                                     LoadCount load) const {
  const Routing& r = captured.routing();
  R3_CHECK(load.counts.empty() || static_cast<int64_t>(load.counts.size()) == num_physical(), "EPLB map: ",
           load.counts.size(), " load counters for ", num_physical(), " physical experts");
  const std::span<int32_t> physical_ids = workspace.array<int32_t>(static_cast<int64_t>(r.expert_ids.size()));
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t k = 0; k < r.top_k; ++k) {
      const auto i = static_cast<std::size_t>(t * r.top_k + k);
      const int32_t logical = r.expert_ids[i];
      R3_CHECK(logical >= 0 && logical < num_logical(), "EPLB map: expert id ", logical,
               " outside [0, ", num_logical(), ")");
      const int32_t physical = map_choice(logical, t, k, r.top_k);
      R3_CHECK(physical >= 0 && physical < num_physical(), "EPLB map: physical expert ", physical,
               " outside [0, ", num_physical(), ")");
      physical_ids[i] = physical;
      const bool padding = !load.padding.empty() && load.padding[static_cast<std::size_t>(t)] != 0;
      if (!load.counts.empty() && !padding) ++load.counts[static_cast<std::size_t>(physical)];
    }
  }
  return PhysicalRouting(r.tokens, r.top_k, physical_ids, r.weights);
}

std::vector<double> PhysicalExperts::logical_load(std::span<const int64_t> physical) const {
  R3_CHECK(static_cast<int64_t>(physical.size()) == num_physical(), "EPLB: ", physical.size(),
           " load counts for ", num_physical(), " physical experts");
  std::vector<double> logical(static_cast<std::size_t>(num_logical()), 0.0);
  for (int32_t p = 0; p < num_physical(); ++p) {
    logical[static_cast<std::size_t>(placement_.logical_of(p))] += static_cast<double>(physical[static_cast<std::size_t>(p)]);
  }
  return logical;
}

void PhysicalExperts::rearrange(ExpertPlacement placement) {
  R3_CHECK(placement.num_logical() == num_logical(), "rearrange: placement for ",
           placement.num_logical(), " experts, layer has ", num_logical());
  std::vector<SwigluExpertWeights> moved;
  for (int32_t p = 0; p < placement.num_physical(); ++p) {
    if (p < num_physical() && placement.logical_of(p) == placement_.logical_of(p)) {
      moved.push_back(physical_[static_cast<std::size_t>(p)]);  // keeps its expert: nothing to copy
      continue;
    }
    // Any current replica of the logical expert holds its weights.
    const int32_t source = placement_.replicas(placement.logical_of(p)).front();
    moved.push_back(copy_expert(physical_[static_cast<std::size_t>(source)]));
  }
  physical_ = std::move(moved);
  placement_ = std::move(placement);
  ++placement_version_;
  build_bank();
}

void PhysicalExperts::rearrange(ExpertPlacement placement,
                                std::vector<std::pair<int32_t, SwigluExpertWeights>> arrived) {
  R3_CHECK(placement.num_logical() == num_logical() && placement.num_physical() == num_physical(),
           "rearrange: placement of ", placement.num_logical(), " experts in ", placement.num_physical(),
           " slots, layer has ", num_logical(), " in ", num_physical());
  std::vector<SwigluExpertWeights> next = physical_;  // tensors share their memory: no copy
  std::vector<bool> given(static_cast<std::size_t>(num_physical()), false);
  for (auto& [slot, w] : arrived) {
    R3_CHECK(slot >= 0 && slot < num_physical() && !given[static_cast<std::size_t>(slot)], "rearrange: slot ", slot,
             " of ", num_physical(), " given twice or out of range");
    R3_CHECK(value_shape(w.gate) == Shape({intermediate_, hidden_}) && value_shape(w.up) == value_shape(w.gate) &&
                 value_shape(w.down) == Shape({hidden_, intermediate_}) && w.gate.dtype() == physical_[0].gate.dtype() &&
                 w.down.dtype() == physical_[0].down.dtype() &&
                 w.gate_bias.defined() == physical_[0].gate_bias.defined() &&
                 w.down_bias.defined() == physical_[0].down_bias.defined(),
             "rearrange: the weights for slot ", slot, " (", dtype_name(w.gate.dtype()), " ",
             shape_to_string(value_shape(w.gate)), ") are not this layer's expert shape");
    given[static_cast<std::size_t>(slot)] = true;
    next[static_cast<std::size_t>(slot)] = std::move(w);
  }
  for (int32_t p = 0; p < num_physical(); ++p) {
    R3_CHECK(given[static_cast<std::size_t>(p)] || placement.logical_of(p) == placement_.logical_of(p), "rearrange: slot ",
             p, " changes from expert ", placement_.logical_of(p), " to expert ", placement.logical_of(p),
             " but its weights never arrived");
  }
  physical_ = std::move(next);
  placement_ = std::move(placement);
  ++placement_version_;
  build_bank();
}

void PhysicalExperts::build_bank() {
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  bank_ = {};
  for (const SwigluExpertWeights& w : physical_) {
    bank_.gate.push_back(ops::WeightMatrix::of(w.gate));
    bank_.up.push_back(ops::WeightMatrix::of(w.up));
    bank_.down.push_back(ops::WeightMatrix::of(w.down));
    bank_.gate_bias.push_back(bias(w.gate_bias));
    bank_.up_bias.push_back(bias(w.up_bias));
    bank_.down_bias.push_back(bias(w.down_bias));
  }
}

}  // namespace r3::moe
