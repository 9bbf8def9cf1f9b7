// The experts of one MoE layer as they are placed: one SwiGLU weight set per physical expert,
// the placement (EPLB) that maps logical ids to physical experts, and the bank the experts
// kernels index by physical expert.
//
// map() is the EPLB step of the pipeline. It only takes a CapturedRouting, so the logical ids
// have always reached the step's capture buffer before they are remapped.
#pragma once

#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "moe/capture.h"
#include "moe/expert_placement.h"
#include "moe/expert_loads.h"
#include "backend/workspace.h"
#include "ops/activation.h"
#include "ops/matmul.h"

namespace r3::moe {

struct SwigluExpertWeights {
  Tensor gate;  // [intermediate, hidden]
  Tensor up;    // [intermediate, hidden]
  Tensor down;  // [hidden, intermediate]
  // [intermediate], [intermediate], [hidden]; GPT-OSS only.
  Tensor gate_bias = Tensor(), up_bias = Tensor(), down_bias = Tensor();
};

// An owned copy of an expert's weights (rows packed; block and MXFP4 scales shared, they are
// never written): a replica's own memory.
SwigluExpertWeights copy_expert(const SwigluExpertWeights& w);

// The gated activation between the experts' two projections.
struct ExpertActivation {
  enum class Kind {
    kSwiglu,   // silu(min(gate, limit)) * clamp(up, ±limit); limit inf: plain SwiGLU
    kGptOss,   // g = min(gate, limit): (clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)
    kSitu,     // Kimi K3: ops::situ(gate, up, beta, linear_beta)
  } kind = Kind::kSwiglu;
  float limit = INFINITY;
  float alpha = 1.702f;
  float beta = 4.0f, linear_beta = INFINITY;  // kSitu

  static ExpertActivation situ(float beta, float linear_beta) {
    ExpertActivation a;
    a.kind = Kind::kSitu;
    a.beta = beta;
    a.linear_beta = linear_beta;
    return a;
  }

  // Inline: the expert kernels call it once per (row, channel).
  float operator()(float gate, float up) const {
    if (kind == Kind::kSwiglu) return ops::clamped_swiglu(gate, up, limit);
    if (kind == Kind::kSitu) return ops::situ(gate, up, beta, linear_beta);
    const float g = gate > limit ? limit : gate;
    const float u = up > limit ? limit : (up < -limit ? -limit : up);
    return (u + 1.0f) * (g * ops::sigmoid(g * alpha));
  }
};

// The experts' weights stacked by physical expert, as the kernels read them: expert e's gate,
// up and down matrices ([I, H], [I, H], [H, I], rows contiguous, in the checkpoint's dtype) and
// biases. On the CPU an entry points at the checkpoint's own (mmap'ed) pages, so stacking copies
// nothing; a device backend uploads the bank into [E, 2I, H] / [E, H, I] buffers.
struct ExpertBank {
  std::vector<ops::WeightMatrix> gate, up, down;                 // [num_physical]
  std::vector<const float*> gate_bias, up_bias, down_bias;       // [num_physical]; nullptr: none
};

// A routing after the EPLB map: physical expert ids, with the logical routing's weights. Only
// PhysicalExperts::map() makes one, from a CapturedRouting.
class PhysicalRouting {
 public:
  const int64_t tokens;
  const int64_t top_k;
  const std::span<const int32_t> physical_ids;  // [tokens, top_k], in the step workspace
  const std::span<const float> weights;         // [tokens, top_k]

 private:
  friend class PhysicalExperts;
  PhysicalRouting(int64_t t, int64_t k, std::span<const int32_t> ids, std::span<const float> w)
      : tokens(t), top_k(k), physical_ids(ids), weights(w) {}
};

class PhysicalExperts {
 public:
  // logical: the checkpoint's experts; placement: where they go (replicas are copied).
  PhysicalExperts(std::vector<SwigluExpertWeights> logical, ExpertPlacement placement,
                  ExpertActivation activation = {});

  int64_t num_logical() const { return placement_.num_logical(); }
  int64_t num_physical() const { return placement_.num_physical(); }
  int64_t hidden_size() const { return hidden_; }
  int64_t intermediate_size() const { return intermediate_; }
  const ExpertActivation& activation() const { return activation_; }
  const ExpertPlacement& placement() const { return placement_; }
  const SwigluExpertWeights& weights(int32_t physical) const { return physical_.at(static_cast<std::size_t>(physical)); }
  const ExpertBank& bank() const { return bank_; }

  // The EPLB map: each (token, choice) goes to replica (token * top_k + choice) % replicas of its
  // logical expert. Counts the tokens of non-padding rows per physical expert into `load`. The
  // physical ids go to `workspace`.
  PhysicalRouting map(backend::Workspace& workspace, const CapturedRouting& routing, LoadCount load = {}) const;

  // Replaces the mapping function (logical, token, choice) -> physical; tests use it to prove
  // capture happens before the map. An empty function restores the placement's own choice.
  using MapFunction = std::function<int32_t(int32_t logical, int64_t token, int64_t choice)>;
  void set_map_function(MapFunction fn) { map_fn_ = std::move(fn); }
  bool has_map_function() const { return static_cast<bool>(map_fn_); }
  // One (token, choice)'s physical expert: the replaced function's, else the placement's choice.
  int32_t map_choice(int32_t logical, int64_t token, int64_t choice, int64_t top_k) const {
    return map_fn_ ? map_fn_(logical, token, choice) : placement_.choose(logical, token, choice, top_k);
  }

  // Logical experts' load from per-physical-expert counts under this placement.
  std::vector<double> logical_load(std::span<const int64_t> physical_counts) const;
  // Moves expert weights to the physical experts of `placement`: a slot that gets another expert
  // gets a copy of it, a slot that keeps its expert keeps its memory.
  void rearrange(ExpertPlacement placement);
  // Re-places the experts with weights that came from elsewhere (expert parallelism: from the rank
  // holding each; moe/ep/expert_moves.h): every slot whose logical expert changes must be among
  // `arrived`, once, with the layer's shapes; the other slots keep theirs.
  void rearrange(ExpertPlacement placement, std::vector<std::pair<int32_t, SwigluExpertWeights>> arrived);
  // Counts rearrange() calls: copies of these experts elsewhere (the GPU's) follow it.
  int64_t placement_version() const { return placement_version_; }

 private:
  ExpertPlacement placement_;
  void build_bank();

  std::vector<SwigluExpertWeights> physical_;  // weights of each physical expert
  ExpertBank bank_;
  int64_t hidden_ = 0, intermediate_ = 0;
  ExpertActivation activation_;
  MapFunction map_fn_;
  int64_t placement_version_ = 0;
};

}  // namespace r3::moe
