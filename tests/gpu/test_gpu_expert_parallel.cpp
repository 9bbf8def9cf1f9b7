// Expert parallelism on the GPU (moe/device_ep_dispatch.h over moe/ep/device_exchange.h, through
// the engine with a PlaceRank): the device plan against a host loop; the in-process device
// exchange between ranks on one GPU; and ranks sharing one GPU, each with its own placed model,
// giving every request the tokens and routed experts one rank gives it. Batch-invariant contexts
// on both sides there, since the ranks' steps hold other requests than one rank's steps; the
// ranks' experts run on the rows kernels, which one rank takes under batch invariance too. (NCCL
// needs a GPU a rank: not run on the single-GPU machine.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "engine/engine.h"
#include "gpu/gpu_test_support.h"
#include "moe/device_ep_dispatch.h"
#include "moe/ep/cuda/in_process_device_exchange.h"
#include "moe/ep/device_expert_moves.h"
#include "moe/ep/expert_moves.h"
#include "moe/ep/expert_parallel_dispatcher.h"
#include "models/device_decoder.h"
#include "models/registry.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

// The family's model on GPU 0 (batch invariant); as rank `rank` of `ranks`, holding only that
// rank's slice of each MoE layer's experts.
engine::PlacedRank placed_on_gpu0(const std::string& family, int rank = 0, int ranks = 1,
                                  const models::LoadOptions& options = {}) {
  engine::PlacedRank placed;
  placed.ctx = backend::Context::cuda(0);
  placed.ctx->set_batch_invariant(true);
  auto host = models::load_model(family_dir(family), options);
  moe::ExpertSlice slice;
  if (ranks > 1) slice = moe::ep::contiguous_slice(host->moe_blocks().front()->experts().num_physical(), ranks, rank);
  placed.model = models::place_on_device(*placed.ctx, std::move(host), DType::F32, moe::MoePath::kMega, slice);
  return placed;
}

// Every request of `want` got the same tokens and routed experts in `got`.
void expect_same_tokens_and_routing(const EngineResults& got, const EngineResults& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, result] : want) {
    EXPECT_EQ(got.at(id).tokens, result.tokens) << "request " << id.first << " sample " << id.second;
    EXPECT_EQ(got.at(id).routed, result.routed) << "request " << id.first << " sample " << id.second;
  }
}

// The device plan against the obvious host loop: each pair's slot among the pairs bound for its
// rank, in pair order; the counts and where each rank's run starts.
TEST(GpuExpertParallel, ThePlanGivesEachPairItsPlaceAmongItsRanksPairsInOrder) {
  auto gpu = backend::Context::cuda(0);
  const int ranks = 5;
  const int64_t physical = 16, pairs = 301;  // not a multiple of the warp
  std::mt19937 rng(3);
  std::vector<int32_t> owner(physical), ids(pairs);
  for (auto& o : owner) o = static_cast<int32_t>(rng() % ranks);
  for (auto& i : ids) i = static_cast<int32_t>(rng() % physical);
  std::vector<int32_t> want_slot(pairs), want_count(ranks, 0), want_offset(ranks, 0);
  for (int64_t p = 0; p < pairs; ++p) want_slot[p] = want_count[owner[ids[p]]]++;
  for (int r = 1; r < ranks; ++r) want_offset[r] = want_offset[r - 1] + want_count[r - 1];
  const Tensor owner_d = gpu_ints(*gpu, owner), ids_d = gpu_ints(*gpu, ids);
  Tensor out = backend::device_empty(*gpu, DType::I32, {2 * ranks + pairs});
  int32_t* o = out.data<int32_t>();
  moe::plan_expert_parallel_slots(*gpu, ids_d.data<int32_t>(), pairs, owner_d.data<int32_t>(), ranks, o, o + ranks,
                                  o + 2 * ranks);
  const Tensor got = backend::to_host(*gpu, out);
  const int32_t* g = got.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(g, g + ranks), want_count);
  EXPECT_EQ(std::vector<int32_t>(g + ranks, g + 2 * ranks), want_offset);
  EXPECT_EQ(std::vector<int32_t>(g + 2 * ranks, g + 2 * ranks + pairs), want_slot);
}

// Three ranks on one GPU exchanging through in-process copies: each receives, from each rank,
// exactly the bytes that rank meant for it, at the place it asked for; sizes that disagree fail
// every rank instead of leaving one waiting.
TEST(GpuExpertParallel, InProcessDeviceExchangeDeliversEachRunWhereItIsExpected) {
  const int n = 3;
  std::vector<std::unique_ptr<backend::Context>> owned;
  std::vector<backend::Context*> contexts;
  for (int r = 0; r < n; ++r) {
    owned.push_back(backend::Context::cuda(0));
    contexts.push_back(owned.back().get());
  }
  moe::ep::InProcessDeviceExchangeGroup group(contexts);
  // Rank r sends (d + 1) ints of value 100 r + d to rank d.
  const auto run = [&](bool disagree) {
    std::vector<std::vector<int32_t>> got(n);
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          backend::Context& ctx = *contexts[static_cast<std::size_t>(r)];
          std::vector<int32_t> send;
          std::vector<int64_t> send_at, send_bytes, recv_at, recv_bytes;
          int64_t in = 0;
          for (int d = 0; d < n; ++d) {
            send_at.push_back(static_cast<int64_t>(send.size()) * 4);
            send_bytes.push_back((d + 1) * 4);
            for (int i = 0; i <= d; ++i) send.push_back(100 * r + d);
            recv_at.push_back(in * 4);
            recv_bytes.push_back((r + 1 + (disagree && r == 2 && d == 0 ? 1 : 0)) * 4);
            in += r + 1 + (disagree && r == 2 && d == 0 ? 1 : 0);
          }
          const Tensor sd = gpu_ints(ctx, send);
          Tensor rd = backend::device_empty(ctx, DType::I32, {in});
          group.rank(r).all_to_all(ctx, static_cast<const std::byte*>(sd.raw_data()), send_at, send_bytes,
                                   static_cast<std::byte*>(rd.raw_data()), recv_at, recv_bytes);
          const Tensor back = backend::to_host(ctx, rd);
          got[static_cast<std::size_t>(r)].assign(back.data<int32_t>(), back.data<int32_t>() + in);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
          group.rank(r).abort(e.what());
        }
      });
    }
    for (auto& t : threads) t.join();
    return std::pair{got, errors};
  };
  const auto [got, errors] = run(false);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    std::vector<int32_t> want;
    for (int s = 0; s < n; ++s) {
      for (int i = 0; i <= r; ++i) want.push_back(100 * s + r);
    }
    EXPECT_EQ(got[static_cast<std::size_t>(r)], want) << "rank " << r;
  }
  const auto [ignored, failed] = run(true);
  for (int r = 0; r < n; ++r) EXPECT_NE(failed[static_cast<std::size_t>(r)], "") << "rank " << r;
  group.reset();
  const auto [again, fine] = run(false);
  for (int r = 0; r < n; ++r) EXPECT_EQ(fine[static_cast<std::size_t>(r)], "") << "rank " << r;
}

TEST(GpuExpertParallel, RanksSharingAGpuGiveOneRanksTokensAndRoutedExperts) {
  for (const std::string family : {"qwen3_moe", "deepseek_v3", "gpt_oss", "kimi_k3"}) {
    engine::PlacedRank one = placed_on_gpu0(family);
    const auto prompts = engine_prompts(10, one.model->info().vocab_size, 5);
    engine::EngineOptions options;
    options.scheduler.max_running = 4;  // requests come and go: steps of changing sizes
    engine::Engine alone(*one.model, *one.ctx, options);
    for (std::size_t i = 0; i < prompts.size(); ++i) alone.submit(greedy_request(prompts[i], 2 + static_cast<int64_t>(i % 4)));
    const EngineResults want = engine_run_all(alone);
    for (const auto& [ranks, sliced] : {std::pair{2, false}, {2, true}, {4, true}}) {
      SCOPED_TRACE(family + ", " + std::to_string(ranks) + " ranks" + (sliced ? ", each holding its experts only" : ""));
      const int slices = sliced ? ranks : 1;
      engine::PlacedRank first = placed_on_gpu0(family, 0, slices);
      engine::EngineOptions o = options;
      o.expert_parallel = ranks;
      engine::Engine group(*first.model, *first.ctx, o, [&](int r) { return placed_on_gpu0(family, r, slices); });
      for (std::size_t i = 0; i < prompts.size(); ++i) group.submit(greedy_request(prompts[i], 2 + static_cast<int64_t>(i % 4)));
      const EngineResults got = engine_run_all(group);
      expect_same_tokens_and_routing(got, want);
      EXPECT_GT(group.stats().expert_rows_exchanged, 0);  // pairs did travel between the ranks
    }
  }
}

// A model placed with a slice of its experts runs only as that rank: alone it is refused by
// name; and a rank whose model holds another slice than the one it owns is refused too.
TEST(GpuExpertParallel, ASlicedModelRunsOnlyAsItsRank) {
  engine::PlacedRank half = placed_on_gpu0("qwen3_moe", 1, 2);
  engine::Engine alone(*half.model, *half.ctx, {});
  alone.submit(greedy_request({1, 2, 3}, 2));
  EXPECT_THROW(engine_run_all(alone), Error);
  engine::PlacedRank wrong = placed_on_gpu0("qwen3_moe", 1, 2);  // rank 0 holding rank 1's slice
  engine::EngineOptions o;
  o.expert_parallel = 2;
  engine::Engine group(*wrong.model, *wrong.ctx, o, [](int r) { return placed_on_gpu0("qwen3_moe", r, 2); });
  group.submit(greedy_request({1, 2, 3}, 2));
  EXPECT_THROW(engine_run_all(group), Error);
}

// The stacked tensors of device experts, as host bytes, to compare two placements' uploads.
std::vector<std::vector<unsigned char>> experts_bytes(backend::Context& ctx, const moe::DeviceExperts& e) {
  std::vector<std::vector<unsigned char>> all;
  for (const Tensor* t : {&e.gate, &e.up, &e.down, &e.gate_scales, &e.up_scales, &e.down_scales, &e.gate_bias,
                          &e.up_bias, &e.down_bias}) {
    if (!t->defined()) {
      all.emplace_back();
      continue;
    }
    const Tensor h = backend::to_host(ctx, *t);
    const auto* b = static_cast<const unsigned char*>(h.raw_data());
    all.emplace_back(b, b + h.nbytes());
  }
  return all;
}

// EPLB's device moves (moe/ep/device_expert_moves.h): one rank, and two and three ranks sharing
// the GPU over in-process copies, each holding its slice, move a layer's changed slots (experts
// rotated by three slots, replicas re-pointed: moves within a rank, across ranks, and swaps); each
// rank then holds, byte for byte, what uploading the new placement's slice gives, in every stored
// format (float32 and bfloat16 values, FP8 with block scales, MXFP4 with its scales and biases).
TEST(GpuExpertParallel, DeviceExpertMovesLeaveEachRankHoldingItsSliceOfTheNewPlacement) {
  for (const auto& [family, dtype] : {std::pair{"qwen3_moe", DType::F32}, {"qwen3_moe", DType::BF16},
                                      {"deepseek_v3_fp8", DType::F32}, {"gpt_oss_mxfp4", DType::F32}}) {
    const auto model = models::load_model(family_dir(family));
    const moe::PhysicalExperts& base = model->moe_blocks().front()->experts();
    std::vector<moe::SwigluExpertWeights> logical;
    for (int32_t p = 0; p < base.num_physical(); ++p) logical.push_back(base.weights(p));
    const auto experts = static_cast<int64_t>(logical.size());
    std::vector<int32_t> rotated;
    for (int64_t p = 0; p < experts; ++p) rotated.push_back(static_cast<int32_t>((p + 3) % experts));
    for (int32_t r : {1, 2, 1, 2}) rotated.push_back(r);
    const moe::ExpertPlacement to(rotated, experts);
    for (int ranks : {1, 2, 3}) {
      SCOPED_TRACE(std::string(family) + ", " + std::string(dtype_name(dtype)) + ", " + std::to_string(ranks) + " ranks");
      moe::PhysicalExperts layer(logical, moe::ExpertPlacement::initial(experts, 4), base.activation());
      const std::vector<int32_t> owners = moe::ep::contiguous_owners(layer.num_physical(), ranks);
      const auto moves = moe::ep::plan_expert_moves(layer.placement(), to, owners);
      std::vector<std::unique_ptr<backend::Context>> contexts;
      std::vector<backend::Context*> raw;
      std::vector<moe::DeviceExperts> held;
      for (int r = 0; r < ranks; ++r) {
        contexts.push_back(backend::Context::cuda(0));
        raw.push_back(contexts.back().get());
        held.push_back(moe::upload_experts(*raw.back(), layer, dtype,
                                           moe::ep::contiguous_slice(layer.num_physical(), ranks, r)));
      }
      std::unique_ptr<moe::ep::InProcessDeviceExchangeGroup> group;
      if (ranks > 1) group = std::make_unique<moe::ep::InProcessDeviceExchangeGroup>(raw);
      std::vector<std::string> errors(static_cast<std::size_t>(ranks));
      {
        std::vector<std::jthread> threads;
        for (int r = 0; r < ranks; ++r) {
          threads.emplace_back([&, r] {
            try {
              moe::ep::move_device_experts(*raw[static_cast<std::size_t>(r)], held[static_cast<std::size_t>(r)], moves,
                                           owners, group ? &group->rank(r) : nullptr);
            } catch (const std::exception& e) {
              errors[static_cast<std::size_t>(r)] = e.what();
              if (group) group->rank(r).abort(e.what());
            }
          });
        }
      }
      layer.rearrange(to);
      for (int r = 0; r < ranks; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        ASSERT_EQ(errors[static_cast<std::size_t>(r)], "");
        backend::Context& ctx = *raw[static_cast<std::size_t>(r)];
        const moe::DeviceExperts want =
            moe::upload_experts(ctx, layer, dtype, moe::ep::contiguous_slice(layer.num_physical(), ranks, r));
        EXPECT_TRUE(experts_bytes(ctx, held[static_cast<std::size_t>(r)]) == experts_bytes(ctx, want));
      }
    }
  }
}

TEST(GpuExpertParallel, GpuRanksNeedAPlacement) {
  engine::PlacedRank one = placed_on_gpu0("qwen3_moe");
  engine::EngineOptions options;
  options.expert_parallel = 2;
  EXPECT_THROW(engine::Engine(*one.model, *one.ctx, options), Error);  // no place_rank
}

// EPLB over GPU ranks that each hold their slice: 8 replicas and a rebalance every step, planned
// from both ranks' loads; the requests get one rank's tokens and routed experts, and the
// rebalances ran.
TEST(GpuExpertParallel, RebalancingGpuRanksChangesNoOutput) {
  for (const std::string family : {"qwen3_moe", "deepseek_v3"}) {
    SCOPED_TRACE(family);
    engine::PlacedRank one = placed_on_gpu0(family);
    const auto prompts = engine_prompts(8, one.model->info().vocab_size, 7);
    engine::EngineOptions options;
    options.scheduler.max_running = 3;
    engine::Engine alone(*one.model, *one.ctx, options);
    for (std::size_t i = 0; i < prompts.size(); ++i) alone.submit(greedy_request(prompts[i], 2 + static_cast<int64_t>(i % 3)));
    const EngineResults want = engine_run_all(alone);
    models::LoadOptions balanced;
    balanced.eplb.redundant_experts = 8;  // as the CPU's expert-parallel EPLB test
    balanced.eplb.rebalance_every = 1;
    balanced.eplb.window_steps = 2;
    const auto rank = [&](int r) { return placed_on_gpu0(family, r, 2, balanced); };
    engine::PlacedRank first = rank(0);
    engine::EngineOptions o = options;
    o.expert_parallel = 2;
    engine::Engine group(*first.model, *first.ctx, o, rank);
    for (std::size_t i = 0; i < prompts.size(); ++i) group.submit(greedy_request(prompts[i], 2 + static_cast<int64_t>(i % 3)));
    const EngineResults got = engine_run_all(group);
    expect_same_tokens_and_routing(got, want);
    EXPECT_GT(first.model->moe_blocks().front()->experts().placement_version(), 0);
  }
}

}  // namespace
}  // namespace r3::test
