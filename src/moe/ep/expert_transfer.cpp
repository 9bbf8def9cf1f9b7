#include "moe/ep/expert_transfer.h"

#include "core/check.h"

namespace r3::moe::ep {

namespace {

template <typename T>
int64_t total(const std::vector<std::vector<T>>& runs) {
  int64_t n = 0;
  for (const auto& run : runs) n += static_cast<int64_t>(run.size());
  return n;
}

}  // namespace

int64_t RankExpertTransfer::sent() const { return total(send); }
int64_t RankExpertTransfer::received() const { return total(receive); }

RankExpertTransfer plan_rank_transfer(std::span<const ExpertMove> moves, std::span<const int32_t> owner_of, int rank,
                                      int ranks) {
  R3_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "EPLB: rank ", rank, " of ", ranks);
  const auto slots = static_cast<int64_t>(owner_of.size());
  const auto owner = [&](int32_t slot) {
    R3_CHECK(slot >= 0 && slot < slots, "EPLB: a move names slot ", slot, " of ", slots);
    const int32_t r = owner_of[static_cast<std::size_t>(slot)];
    R3_CHECK(r >= 0 && r < ranks, "EPLB: slot ", slot, " is held by rank ", r, " of ", ranks);
    return static_cast<std::size_t>(r);
  };
  RankExpertTransfer t;
  t.send.resize(static_cast<std::size_t>(ranks));
  t.receive.resize(static_cast<std::size_t>(ranks));
  const auto me = static_cast<std::size_t>(rank);
  for (const ExpertMove& m : moves) {
    const std::size_t source = owner(m.source_slot), destination = owner(m.slot);
    if (source == me) t.send[destination].push_back(m);
    if (destination == me) t.receive[source].push_back(m.slot);
  }
  return t;
}

}  // namespace r3::moe::ep
