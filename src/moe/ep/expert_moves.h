// EPLB across expert-parallel ranks: when the rebalancer re-places a layer's experts, each
// physical slot that gets another logical expert needs that expert's weights, and only the rank
// owning the slot holds it. The weights come from a slot that held the same logical expert before:
// one on the slot's own rank when there is one (a copy in its memory), else the lowest such slot,
// whose rank sends them through the transport (moe/ep/transport.h; one all-to-all a layer, so a
// rebalance moves layer by layer and the engine can spread the layers over steps). The NCCL
// transport will carry the same messages between GPUs.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "moe/expert_placement.h"
#include "moe/ep/transport.h"
#include "moe/physical_experts.h"

namespace r3::moe::ep {

struct ExpertMove {
  int32_t slot;         // the physical expert whose logical expert changes
  int32_t source_slot;  // a physical expert holding that logical expert before the change
};

// The moves that take a layer from placement `from` to `to` (same experts, same slots), in slot
// order; owner_of[slot] is the rank holding each slot. Slots keeping their logical expert move
// nothing.
std::vector<ExpertMove> plan_expert_moves(const ExpertPlacement& from, const ExpertPlacement& to,
                                          std::span<const int32_t> owner_of);

struct ArrivedExperts {
  std::vector<std::pair<int32_t, SwigluExpertWeights>> slots;  // this rank's changed slots, with their weights
  int64_t bytes_received = 0;                                   // from other ranks
};

// A collective: every rank of the transport's group calls it with the same moves, for the same
// layer. Reads only the slots of `experts` this rank owns (the sources it sends or copies) and
// returns the weights of the slots it owns that change, for PhysicalExperts::rearrange once every
// rank has returned. Throws if a message is malformed or carries a slot this rank did not expect.
ArrivedExperts move_expert_weights(Transport& transport, const PhysicalExperts& experts,
                                   std::span<const ExpertMove> moves, std::span<const int32_t> owner_of);

}  // namespace r3::moe::ep
