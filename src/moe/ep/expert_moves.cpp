#include "moe/ep/expert_moves.h"

#include <algorithm>

#include "core/check.h"
#include "moe/ep/expert_transfer.h"
#include "moe/ep/expert_weights_wire.h"

namespace r3::moe::ep {

std::vector<ExpertMove> plan_expert_moves(const ExpertPlacement& from, const ExpertPlacement& to,
                                          std::span<const int32_t> owner_of) {
  R3_CHECK(from.num_physical() == to.num_physical() && from.num_logical() == to.num_logical() &&
               static_cast<int64_t>(owner_of.size()) == to.num_physical(),
           "EPLB: moving ", from.num_logical(), " experts in ", from.num_physical(), " slots to ", to.num_logical(),
           " in ", to.num_physical(), " over owners of ", owner_of.size(), " slots");
  std::vector<ExpertMove> moves;
  for (int32_t slot = 0; slot < to.num_physical(); ++slot) {
    const int32_t logical = to.logical_of(slot);
    if (from.logical_of(slot) == logical) continue;
    const std::vector<int32_t>& holders = from.replicas(logical);
    const auto own = std::find_if(holders.begin(), holders.end(), [&](int32_t s) { return owner_of[s] == owner_of[slot]; });
    moves.push_back({slot, own != holders.end() ? *own : holders.front()});
  }
  return moves;
}

ArrivedExperts move_expert_weights(Transport& transport, const PhysicalExperts& experts,
                                   std::span<const ExpertMove> moves, std::span<const int32_t> owner_of) {
  const int me = transport.rank(), ranks = transport.size();
  R3_CHECK(static_cast<int64_t>(owner_of.size()) == experts.num_physical(), "EPLB: owners of ", owner_of.size(),
           " slots for ", experts.num_physical(), " physical experts");
  const RankExpertTransfer plan = plan_rank_transfer(moves, owner_of, me, ranks);
  ArrivedExperts arrived;
  std::vector<Buffer> to_each(static_cast<std::size_t>(ranks));
  for (std::size_t d = 0; d < to_each.size(); ++d) {
    const std::vector<ExpertMove>& sends = plan.send[d];
    if (static_cast<int>(d) == me) {  // moves within this rank: a copy in its memory
      for (const ExpertMove& move : sends) {
        arrived.slots.emplace_back(move.slot, copy_expert(experts.weights(move.source_slot)));
      }
      continue;
    }
    std::size_t size = 0;  // each message allocated once
    for (const ExpertMove& move : sends) size += expert_bytes(experts.weights(move.source_slot));
    to_each[d].reserve(size);
    for (const ExpertMove& move : sends) append_expert(to_each[d], move.slot, experts.weights(move.source_slot));
  }
  // The source rank of each slot this rank expects to receive: what a message may carry.
  std::vector<int> expected_from(static_cast<std::size_t>(experts.num_physical()), -1);
  for (std::size_t s = 0; s < plan.receive.size(); ++s) {
    if (static_cast<int>(s) == me) continue;
    for (int32_t slot : plan.receive[s]) expected_from[static_cast<std::size_t>(slot)] = static_cast<int>(s);
  }
  // Every rank has read its sources before any rank changes a slot: the caller re-places the
  // layer only after every rank has returned.
  const std::vector<Buffer> received = transport.all_to_all(std::move(to_each));
  for (int s = 0; s < ranks; ++s) {
    if (s == me) continue;
    const Buffer& message = received[static_cast<std::size_t>(s)];
    arrived.bytes_received += static_cast<int64_t>(message.size());
    for (ExpertReader reader(message, s); !reader.done();) {
      auto [slot, weights] = reader.next();
      R3_CHECK(slot >= 0 && slot < experts.num_physical() && expected_from[static_cast<std::size_t>(slot)] == s,
               "EPLB: rank ", s, " sent the weights of slot ", slot, ", which rank ", me, " does not take from it");
      expected_from[static_cast<std::size_t>(slot)] = -1;  // once
      arrived.slots.emplace_back(slot, std::move(weights));
    }
  }
  return arrived;
}

}  // namespace r3::moe::ep
