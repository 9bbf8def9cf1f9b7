// The tokens of one forward step: which sequence each belongs to and at which position.
// A sequence's tokens in a step are consecutive positions continuing its cached prefix.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/workspace.h"

#include "moe/capture.h"
#include "moe/dispatcher.h"
#include "moe/expert_loads.h"
#include "ops/step_view.h"

namespace r3::models {

struct ForwardBatch {
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int32_t> seqs;  // KV cache sequence of each token; kPadding for padding rows
  // Padding rows (sequence kPadding) run through the layers like any token but read and write no
  // KV cache and belong to no sequence; their routing is never attributed to a request.
  static constexpr int32_t kPadding = -1;
  // Token rows to compute logits for (lm_head is the largest matmul); empty means every row.
  std::vector<int64_t> logit_rows;
  // Routing to replay: [tokens, num MoE layers, top_k] logical ids, or empty to route freely.
  std::vector<int32_t> forced_routing;
  // [tokens]: 1 where the row replays its forced_routing ids, 0 where it routes freely (its ids
  // are then ignored), so replayed and free sequences share one step. Empty: every row replays
  // (when forced_routing is given).
  std::vector<uint8_t> replayed;
  // The step's routed-experts capture buffer, sized for these rows; every MoE layer records its
  // logical ids there. Required by every capturing MoE path.
  moe::CaptureBuffer* capture = nullptr;
  // The step's per-expert token counts (EPLB), filled by the MoE layers; nullptr: not counted.
  moe::ExpertLoads* loads = nullptr;
  // Where the MoE layers' routed rows go to their experts: nullptr is this device; an
  // expert-parallel rank's dispatcher sends them to the ranks that hold the experts.
  const moe::Dispatcher* dispatcher = nullptr;

  int64_t size() const { return static_cast<int64_t>(token_ids.size()); }
  // The step's metadata as the attention layers take it on the host (ops/step_view.h): pointers
  // into this batch, valid while it lives unchanged; the block tables come from the cache, a
  // layer's own (KvCache::step_for_layer).
  ops::StepView view() const;
  // [tokens]: 1 for padding rows (in `workspace`).
  std::span<const uint8_t> padding_mask(backend::Workspace& workspace) const;

  // The replayed routing of MoE layer j as [tokens, k] (rows of free tokens included, see
  // `replayed`) in `workspace`, or empty when nothing is replayed.
  std::span<const int32_t> forced_for_layer(backend::Workspace& workspace, int64_t j, int64_t moe_layers,
                                            int64_t k) const;

  // One sequence: `ids` at positions start, start+1, ... in `seq`.
  static ForwardBatch sequence(const std::vector<int32_t>& ids, int32_t start, int32_t seq = 0);
};

}  // namespace r3::models
