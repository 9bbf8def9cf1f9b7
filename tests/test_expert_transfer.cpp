// EPLB across ranks: each rank's part of a layer's moves (moe/ep/expert_transfer.h). The ranks'
// parts agree (what s packs for d is what d unpacks from s, in the same order, and s knows the
// slots it fills there), each rank reads and writes only its own slots, and carrying out every
// rank's part, every source read before any slot is written (as the moves do: pack, exchange,
// unpack), leaves every slot holding the new placement's expert, swaps and replicas included.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "core/check.h"
#include "moe/expert_placement.h"
#include "moe/ep/expert_moves.h"
#include "moe/ep/expert_parallel_dispatcher.h"
#include "moe/ep/expert_transfer.h"

namespace r3::test {
namespace {

using moe::ExpertPlacement;
using moe::ep::RankExpertTransfer;

// The sources of moves, and the slots they fill.
std::vector<int32_t> sources_of(const std::vector<moe::ep::ExpertMove>& moves) {
  std::vector<int32_t> v;
  for (const moe::ep::ExpertMove& m : moves) v.push_back(m.source_slot);
  return v;
}
std::vector<int32_t> slots_of(const std::vector<moe::ep::ExpertMove>& moves) {
  std::vector<int32_t> v;
  for (const moe::ep::ExpertMove& m : moves) v.push_back(m.slot);
  return v;
}

// Every rank's part carried out on `held` (the logical expert each slot holds): each rank packs
// its runs from the slots as they were, then each writes what came into its slots.
std::vector<int32_t> carried_out(std::vector<int32_t> held, const std::vector<RankExpertTransfer>& parts,
                                 const std::vector<int32_t>& owners) {
  const auto ranks = parts.size();
  std::vector<std::vector<std::vector<int32_t>>> runs(ranks, std::vector<std::vector<int32_t>>(ranks));
  for (std::size_t s = 0; s < ranks; ++s) {
    for (std::size_t d = 0; d < ranks; ++d) {
      for (const moe::ep::ExpertMove& m : parts[s].send[d]) {
        EXPECT_EQ(owners[static_cast<std::size_t>(m.source_slot)], static_cast<int32_t>(s))
            << "rank " << s << " reads slot " << m.source_slot;
        runs[s][d].push_back(held[static_cast<std::size_t>(m.source_slot)]);
      }
    }
  }
  for (std::size_t d = 0; d < ranks; ++d) {
    for (std::size_t s = 0; s < ranks; ++s) {
      const std::vector<int32_t>& into = parts[d].receive[s];
      EXPECT_EQ(into.size(), runs[s][d].size()) << "rank " << s << " to rank " << d;
      EXPECT_EQ(slots_of(parts[s].send[d]), into) << "the slots rank " << s << " fills on rank " << d;
      for (std::size_t i = 0; i < std::min(into.size(), runs[s][d].size()); ++i) {
        EXPECT_EQ(owners[static_cast<std::size_t>(into[i])], static_cast<int32_t>(d))
            << "rank " << d << " writes slot " << into[i];
        held[static_cast<std::size_t>(into[i])] = runs[s][d][i];
      }
    }
  }
  return held;
}

std::vector<RankExpertTransfer> every_part(const std::vector<moe::ep::ExpertMove>& moves,
                                           const std::vector<int32_t>& owners, int ranks) {
  std::vector<RankExpertTransfer> parts;
  for (int r = 0; r < ranks; ++r) parts.push_back(moe::ep::plan_rank_transfer(moves, owners, r, ranks));
  return parts;
}

// A placement of `logical` experts on `physical` slots, each expert at least once, shuffled.
ExpertPlacement random_placement(std::mt19937& rng, int64_t logical, int64_t physical) {
  std::vector<int32_t> p(static_cast<std::size_t>(physical));
  std::iota(p.begin(), p.begin() + logical, 0);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(logical - 1));
  for (auto i = static_cast<std::size_t>(logical); i < p.size(); ++i) p[i] = any(rng);
  std::shuffle(p.begin(), p.end(), rng);
  return ExpertPlacement(p, logical);
}

TEST(ExpertTransfer, RanksCarryingOutTheirPartsHoldTheNewPlacement) {
  std::mt19937 rng(7);
  for (int ranks : {1, 2, 4, 8}) {
    for (int trial = 0; trial < 50; ++trial) {
      SCOPED_TRACE(testing::Message() << ranks << " ranks, trial " << trial);
      const int64_t logical = 16, physical = 16 + 8 * (trial % 3);
      const ExpertPlacement from = random_placement(rng, logical, physical);
      const ExpertPlacement to = random_placement(rng, logical, physical);
      const std::vector<int32_t> owners = moe::ep::contiguous_owners(physical, ranks);
      const auto moves = moe::ep::plan_expert_moves(from, to, owners);
      const std::vector<RankExpertTransfer> parts = every_part(moves, owners, ranks);
      int64_t sent = 0, received = 0;
      for (const RankExpertTransfer& p : parts) {
        sent += p.sent();
        received += p.received();
      }
      EXPECT_EQ(sent, static_cast<int64_t>(moves.size()));
      EXPECT_EQ(received, static_cast<int64_t>(moves.size()));
      EXPECT_EQ(carried_out(from.physical_to_logical(), parts, owners), to.physical_to_logical());
    }
  }
}

TEST(ExpertTransfer, TwoSlotsSwappingTheirExpertsOnOneRankTakeEachOthers) {
  const ExpertPlacement from({0, 1, 2, 3}, 4), to({1, 0, 2, 3}, 4);
  for (int ranks : {1, 2}) {
    const std::vector<int32_t> owners = moe::ep::contiguous_owners(4, ranks);
    const auto moves = moe::ep::plan_expert_moves(from, to, owners);
    ASSERT_EQ(moves.size(), 2u);
    const std::vector<RankExpertTransfer> parts = every_part(moves, owners, ranks);
    // Rank 0 holds both slots: its run to itself carries both experts.
    EXPECT_EQ(sources_of(parts[0].send[0]), (std::vector<int32_t>{1, 0}));
    EXPECT_EQ(parts[0].receive[0], (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(carried_out(from.physical_to_logical(), parts, owners), to.physical_to_logical());
  }
}

TEST(ExpertTransfer, AnExpertCrossingRanksLeavesInTheSourcesRunAndArrivesInTheSlotsRun) {
  // Slots 0-1 on rank 0, 2-3 on rank 1; expert 2 (only in slot 2) replaces expert 1 in slot 1.
  const ExpertPlacement from({0, 1, 2, 3}, 4), to({0, 2, 1, 3}, 4);
  const std::vector<int32_t> owners = moe::ep::contiguous_owners(4, 2);
  const std::vector<RankExpertTransfer> parts = every_part(moe::ep::plan_expert_moves(from, to, owners), owners, 2);
  EXPECT_EQ(sources_of(parts[1].send[0]), (std::vector<int32_t>{2}));
  EXPECT_EQ(parts[0].receive[1], (std::vector<int32_t>{1}));
  EXPECT_EQ(sources_of(parts[0].send[1]), (std::vector<int32_t>{1}));
  EXPECT_EQ(parts[1].receive[0], (std::vector<int32_t>{2}));
  EXPECT_TRUE(parts[0].send[0].empty() && parts[1].send[1].empty());
}

TEST(ExpertTransfer, AMoveOutsideTheSlotsOrTheRanksIsRefused) {
  const std::vector<int32_t> owners = {0, 0, 1, 1};
  const std::vector<moe::ep::ExpertMove> outside = {{4, 0}};
  EXPECT_THROW(moe::ep::plan_rank_transfer(outside, owners, 0, 2), Error);
  const std::vector<moe::ep::ExpertMove> fine = {{2, 0}};
  EXPECT_THROW(moe::ep::plan_rank_transfer(fine, owners, 0, 1), Error);  // slot 2's rank 1 of 1
  EXPECT_THROW(moe::ep::plan_rank_transfer(fine, owners, 2, 2), Error);
  EXPECT_NO_THROW(moe::ep::plan_rank_transfer(fine, owners, 1, 2));
}

}  // namespace
}  // namespace r3::test
