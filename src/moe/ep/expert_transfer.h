// EPLB across expert-parallel ranks: a layer's moves (moe/ep/expert_moves.h) as one rank takes
// part in them. Every rank derives its part from the same moves, so the ranks pack, exchange and
// unpack expert weights in one agreed order with nothing more said: rank s's run to rank d
// carries, in move order, the source slots of the moves from a slot of s to a slot of d, and rank
// d writes them into those moves' slots in the same order. A rank's run to itself carries its
// local moves, so every source is read before any slot is written (two slots that swap their
// experts stay right). The host ranks' moves (move_expert_weights) take their messages from it,
// and the GPU ranks' (moe/ep/device_expert_moves.h) their packing and unpacking.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moe/ep/expert_moves.h"

namespace r3::moe::ep {

struct RankExpertTransfer {
  std::vector<std::vector<ExpertMove>> send;  // [rank d]: the moves from this rank's slots to d's, in move order
  std::vector<std::vector<int32_t>> receive;  // [rank s]: slots this rank fills from s's run, in move order

  int64_t sent() const;      // source slots packed, over all ranks
  int64_t received() const;  // slots filled, over all ranks
};

// Rank `rank`'s part of `moves` among `ranks` ranks; owner_of[slot]: the rank holding each
// physical slot. Throws on a slot out of range or an owner outside [0, ranks).
RankExpertTransfer plan_rank_transfer(std::span<const ExpertMove> moves, std::span<const int32_t> owner_of, int rank,
                                      int ranks);

}  // namespace r3::moe::ep
