// The in-process transport of expert parallelism (moe/ep/in_process_transport.h): N ranks as
// threads exchange byte buffers all-to-all, each receiving exactly what every rank sent it, round
// after round; a rank that fails releases the others with its reason instead of leaving them
// waiting.
#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "moe/ep/in_process_transport.h"
#include "rank_threads.h"

namespace r3::test {
namespace {

using moe::ep::Buffer;

// The buffer rank `from` sends rank `to` in round `round`: a length and bytes that name all three.
Buffer transport_message(int from, int to, int round) {
  Buffer b(static_cast<std::size_t>((from * 7 + to * 3 + round) % 11));  // empty ones included
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(from * 64 + to * 8 + round + static_cast<int>(i));
  return b;
}

TEST(InProcessTransport, EveryRankReceivesWhatEachRankSentItRoundAfterRound) {
  for (const int ranks : {1, 2, 4, 8}) {
    moe::ep::InProcessGroup group(ranks);
    std::vector<int> mismatches(static_cast<std::size_t>(ranks), 0);
    const auto errors = run_rank_threads(group, [&](int r) {
      moe::ep::Transport& t = group.rank(r);
      ASSERT_EQ(t.rank(), r);
      ASSERT_EQ(t.size(), ranks);
      for (int round = 0; round < 20; ++round) {
        std::vector<Buffer> out;
        for (int d = 0; d < ranks; ++d) out.push_back(transport_message(r, d, round));
        const std::vector<Buffer> in = t.all_to_all(std::move(out));
        ASSERT_EQ(static_cast<int>(in.size()), ranks);
        for (int s = 0; s < ranks; ++s) mismatches[static_cast<std::size_t>(r)] += in[static_cast<std::size_t>(s)] != transport_message(s, r, round);
      }
    });
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << ranks << " ranks, rank " << r;
      EXPECT_EQ(mismatches[static_cast<std::size_t>(r)], 0) << ranks << " ranks, rank " << r;
    }
  }
}

TEST(InProcessTransport, AFailedRankReleasesTheOthersWithItsReason) {
  moe::ep::InProcessGroup group(4);
  const auto errors = run_rank_threads(group, [&](int r) {
    moe::ep::Transport& t = group.rank(r);
    t.all_to_all(std::vector<Buffer>(4));  // one exchange succeeds
    if (r == 2) {
      t.abort("its experts threw");
      return;
    }
    t.all_to_all(std::vector<Buffer>(4));  // would wait for rank 2 forever
  });
  EXPECT_EQ(errors[2], "");
  for (const int r : {0, 1, 3}) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("rank 2: its experts threw"), std::string::npos) << errors[static_cast<std::size_t>(r)];
  }
}

TEST(InProcessTransport, AGroupNeedsARankAndRanksAreInRange) {
  EXPECT_THROW(moe::ep::InProcessGroup(0), Error);
  moe::ep::InProcessGroup group(2);
  EXPECT_THROW(group.rank(2), Error);
  EXPECT_THROW(group.rank(-1), Error);
}

TEST(InProcessTransport, TheWrongNumberOfBuffersFailsEveryRank) {
  moe::ep::InProcessGroup group(3);
  const auto errors = run_rank_threads(group, [&](int r) { group.rank(r).all_to_all(std::vector<Buffer>(r == 1 ? 2 : 3)); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("rank 1 sent 2 buffers to a group of 3"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
  }
}

}  // namespace
}  // namespace r3::test
