// Expert parallelism on the CPU (moe/ep/expert_parallel_dispatcher.h over the in-process
// transport): 2, 4 and 8 ranks as threads, each with its own tokens and routing and a slice of the
// physical experts, run both experts kernels through the all-to-all dispatch and combine; every
// rank's output equals, bit for bit, what one rank computes for the same tokens with every
// expert local. With EPLB replicas too (several physical experts per logical one).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/context.h"
#include "moe/capture.h"
#include "moe/ep/expert_parallel_dispatcher.h"
#include "moe/ep/in_process_transport.h"
#include "moe/expert_placement.h"
#include "moe/expert_kernels.h"
#include "moe/physical_experts.h"
#include "moe/routing.h"
#include "test_support.h"

namespace r3::test {
namespace {

class DiscardCapture final : public moe::CaptureBuffer {
 public:
  void record(int64_t, std::span<const int32_t>, std::span<const float>, std::span<const float>) override {}
};

struct RankTokens {
  Tensor hidden;                // [tokens, h]
  std::vector<int32_t> ids;     // [tokens, k] logical
  std::vector<float> weights;   // [tokens, k]
};

// `tokens` tokens of rank `rank`: random rows, k distinct logical experts each, random weights.
RankTokens ep_tokens(int64_t tokens, int64_t h, int64_t experts, int64_t k, uint32_t seed) {
  RankTokens r{random_normal({tokens, h}, seed), {}, {}};
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool(static_cast<std::size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) pool[static_cast<std::size_t>(e)] = static_cast<int32_t>(e);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t c = 0; c < k; ++c) {
      r.ids.push_back(pool[static_cast<std::size_t>(c)]);
      r.weights.push_back(weight(rng));
    }
  }
  return r;
}

// The experts' output for these tokens through `dispatcher` (the capture, then the EPLB map, as
// the MoE layer runs them); `fused` picks the kernel.
std::vector<float> ep_experts_out(backend::Context& ctx, const moe::PhysicalExperts& experts, const RankTokens& r,
                                  int64_t k, bool fused, const moe::Dispatcher& dispatcher) {
  backend::Workspace routing_space;
  const int64_t tokens = r.hidden.dim(0);
  moe::Routing routing = moe::Routing::in(routing_space, tokens, k);
  std::copy(r.ids.begin(), r.ids.end(), routing.expert_ids.begin());
  std::copy(r.weights.begin(), r.weights.end(), routing.weights.begin());
  DiscardCapture capture;
  const moe::PhysicalRouting physical = experts.map(routing_space, moe::capture(routing, 0, &capture));
  Tensor out = Tensor::empty(DType::F32, r.hidden.shape());
  if (fused) moe::fused_experts(ctx, r.hidden, physical, experts, out, dispatcher);
  else moe::grouped_experts(ctx, r.hidden, physical, experts, out, dispatcher);
  return std::vector<float>(out.data<float>(), out.data<float>() + out.numel());
}

TEST(ExpertParallel, EveryRanksOutputEqualsOneRanksBitForBit) {
  const int64_t h = 24, inter = 20, logical = 8, k = 3;
  std::vector<moe::SwigluExpertWeights> weights;
  for (uint32_t e = 0; e < logical; ++e) {
    weights.push_back({random_normal({inter, h}, 300 + e), random_normal({inter, h}, 400 + e),
                       random_normal({h, inter}, 500 + e)});
  }
  for (const int64_t redundant : {0, 8}) {
    const moe::PhysicalExperts experts(weights, moe::ExpertPlacement::initial(logical, redundant));
    for (const int ranks : {2, 4, 8}) {
      for (const bool fused : {false, true}) {
        SCOPED_TRACE(std::to_string(ranks) + " ranks, " + std::to_string(redundant) + " redundant, " +
                     (fused ? "fused" : "grouped"));
        std::vector<RankTokens> tokens;
        for (int r = 0; r < ranks; ++r) tokens.push_back(ep_tokens((r * 5) % 7, h, logical, k, 1000 + r));  // rank 0: none
        std::vector<std::vector<float>> want;
        backend::Context one(1);
        for (int r = 0; r < ranks; ++r) {
          want.push_back(ep_experts_out(one, experts, tokens[static_cast<std::size_t>(r)], k, fused, moe::local_dispatcher()));
        }
        moe::ep::InProcessGroup group(ranks);
        const std::vector<int32_t> owners = moe::ep::contiguous_owners(experts.num_physical(), ranks);
        std::vector<std::vector<float>> got(static_cast<std::size_t>(ranks));
        std::vector<std::string> errors(static_cast<std::size_t>(ranks));
        std::vector<std::thread> threads;
        for (int r = 0; r < ranks; ++r) {
          threads.emplace_back([&, r] {
            try {
              backend::Context ctx(1);
              const moe::ep::ExpertParallelDispatcher dispatcher(group.rank(r), owners);
              got[static_cast<std::size_t>(r)] =
                  ep_experts_out(ctx, experts, tokens[static_cast<std::size_t>(r)], k, fused, dispatcher);
            } catch (const std::exception& e) {
              errors[static_cast<std::size_t>(r)] = e.what();
              group.rank(r).abort(e.what());
            }
          });
        }
        for (auto& t : threads) t.join();
        for (int r = 0; r < ranks; ++r) {
          const auto i = static_cast<std::size_t>(r);
          EXPECT_EQ(errors[i], "") << "rank " << r;
          ASSERT_EQ(got[i].size(), want[i].size()) << "rank " << r;
          // (A rank without tokens has empty outputs, whose data() may be null: no memcmp then.)
          EXPECT_TRUE(want[i].empty() || std::memcmp(got[i].data(), want[i].data(), sizeof(float) * want[i].size()) == 0)
              << "rank " << r;
        }
      }
    }
  }
}

TEST(ExpertParallel, OwnersAreContiguousSlicesAndChecked) {
  EXPECT_EQ(moe::ep::contiguous_owners(8, 4), (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(moe::ep::contiguous_owners(5, 2), (std::vector<int32_t>{0, 0, 0, 1, 1}));
  EXPECT_THROW(moe::ep::contiguous_owners(3, 4), Error);
  moe::ep::InProcessGroup group(2);
  EXPECT_THROW(moe::ep::ExpertParallelDispatcher(group.rank(0), {0, 2}), Error);
}

}  // namespace
}  // namespace r3::test
