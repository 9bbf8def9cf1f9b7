// EPLB across expert-parallel ranks (moe/ep/expert_moves.h, moe/ep/expert_weights_wire.h): an
// expert's weights cross the transport with their bits in every stored format (float32, FP8 with
// block scales, MXFP4 with its scales, biases); a message cut short or corrupt is refused naming
// the rank it came from; a re-placement takes each changed slot's weights from a replica on the
// slot's own rank when there is one; ranks re-placed through the in-process transport hold
// exactly the new placement's experts; and the engine's rebalances move weights between ranks,
// layer by layer when asked, without changing any output.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "engine/engine.h"
#include "engine_checks.h"
#include "models/registry.h"
#include "moe/eplb/eplb_controller.h"
#include "moe/ep/expert_moves.h"
#include "moe/ep/expert_parallel_dispatcher.h"
#include "moe/ep/expert_weights_wire.h"
#include "moe/ep/in_process_transport.h"
#include "rank_threads.h"
#include "test_support.h"

namespace r3::test {
namespace {

using moe::ExpertPlacement;
using moe::SwigluExpertWeights;
using moe::ep::Buffer;

// A tensor's values as float32 bits, every scale applied (row_to_f32): equal bits mean equal
// stored values and scales, whatever the format.
std::vector<uint32_t> moves_decoded_bits(const Tensor& t) {
  if (!t.defined()) return {};
  std::vector<float> values;
  if (t.rank() == 1) {
    const Tensor f = to_f32(t);
    values.assign(f.data<float>(), f.data<float>() + f.numel());
  } else {
    const int64_t cols = value_shape(t)[1];
    values.resize(static_cast<std::size_t>(t.dim(0) * cols));
    for (int64_t r = 0; r < t.dim(0); ++r) row_to_f32(t, r, values.data() + r * cols);
  }
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

void expect_same_expert(const SwigluExpertWeights& a, const SwigluExpertWeights& b) {
  const std::vector<std::pair<const Tensor*, const Tensor*>> pairs = {
      {&a.gate, &b.gate}, {&a.up, &b.up}, {&a.down, &b.down}, {&a.gate_bias, &b.gate_bias},
      {&a.up_bias, &b.up_bias}, {&a.down_bias, &b.down_bias}};
  for (const auto& [x, y] : pairs) {
    ASSERT_EQ(x->defined(), y->defined());
    if (!x->defined()) continue;
    EXPECT_EQ(x->dtype(), y->dtype());
    EXPECT_EQ(value_shape(*x), value_shape(*y));
    EXPECT_EQ(x->block_scales() != nullptr, y->block_scales() != nullptr);
    EXPECT_EQ(x->mx_scales() != nullptr, y->mx_scales() != nullptr);
    EXPECT_EQ(moves_decoded_bits(*x), moves_decoded_bits(*y));
  }
}

// The first MoE layer's experts of a fixture (the model keeps them alive).
struct FixtureExperts {
  std::unique_ptr<models::CausalLM> model;
  std::vector<SwigluExpertWeights> logical;
  moe::ExpertActivation activation;
};

FixtureExperts fixture_experts(const std::string& family) {
  FixtureExperts f{models::load_model(family_dir(family)), {}, {}};
  const moe::PhysicalExperts& experts = f.model->moe_blocks().front()->experts();
  for (int32_t p = 0; p < experts.num_physical(); ++p) f.logical.push_back(experts.weights(p));
  f.activation = experts.activation();
  return f;
}

TEST(ExpertWeightsWire, EveryStoredFormatArrivesWithItsBits) {
  // float32, FP8 with 128x128-style block scales, MXFP4 (strided gate/up views) with biases.
  for (const char* family : {"qwen3_moe", "deepseek_v3_fp8", "gpt_oss_mxfp4", "gpt_oss"}) {
    SCOPED_TRACE(family);
    const FixtureExperts f = fixture_experts(family);
    Buffer message;
    const int32_t n = std::min<int32_t>(3, static_cast<int32_t>(f.logical.size()));
    for (int32_t e = 0; e < n; ++e) moe::ep::append_expert(message, 10 + e, f.logical[static_cast<std::size_t>(e)]);
    moe::ep::ExpertReader reader(message, 2);
    for (int32_t e = 0; e < n; ++e) {
      ASSERT_FALSE(reader.done());
      const auto [slot, w] = reader.next();
      EXPECT_EQ(slot, 10 + e);
      expect_same_expert(w, f.logical[static_cast<std::size_t>(e)]);
    }
    EXPECT_TRUE(reader.done());
  }
}

TEST(ExpertWeightsWire, AnFp8MatrixCutInsideItsScaleBlocksKeepsItsScales) {
  // Rows [20, 36) of a [40, 48] FP8 matrix in 16 x 16 blocks: the view starts 4 rows into its
  // second block row and ends inside the third.
  Tensor values = Tensor::empty(DType::F8_E4M3, {40, 48});
  auto* bytes = static_cast<uint8_t*>(values.raw_data());
  for (int64_t i = 0; i < values.numel(); ++i) bytes[i] = static_cast<uint8_t>((i * 37 + 11) % 0x7E);  // no NaN
  Tensor scales = Tensor::empty(DType::F32, {3, 3});
  for (int64_t i = 0; i < 9; ++i) scales.data<float>()[i] = 0.5f + 0.25f * static_cast<float>(i);
  BlockScales s;
  s.scales = scales;
  s.block_rows = 16;
  s.block_cols = 16;
  const Tensor matrix = values.with_block_scales(std::move(s));
  SwigluExpertWeights w{matrix.rows(20, 36), matrix.rows(4, 20), matrix.rows(0, 40)};
  Buffer message;
  moe::ep::append_expert(message, 7, w);
  moe::ep::ExpertReader reader(message, 0);
  const auto [slot, got] = reader.next();
  EXPECT_EQ(slot, 7);
  expect_same_expert(got, w);
  EXPECT_TRUE(reader.done());
}

TEST(ExpertWeightsWire, ATruncatedOrCorruptMessageIsRefusedNamingItsRank) {
  for (const char* family : {"qwen3_moe", "deepseek_v3_fp8", "gpt_oss_mxfp4"}) {
    SCOPED_TRACE(family);
    const FixtureExperts f = fixture_experts(family);
    Buffer whole;
    moe::ep::append_expert(whole, 1, f.logical.front());
    // Every cut (up to 400 of them, spread over the message) ends inside an expert.
    const std::size_t stride = std::max<std::size_t>(1, whole.size() / 400);
    for (std::size_t cut = 1; cut < whole.size(); cut += stride) {
      const Buffer part(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(cut));
      const std::string error = error_of([&] {
        moe::ep::ExpertReader reader(part, 5);
        while (!reader.done()) reader.next();
      });
      ASSERT_NE(error.find("from rank 5"), std::string::npos) << "cut at " << cut << ": " << error;
    }
    Buffer bad_dtype = whole;
    bad_dtype[5] = std::byte{200};  // slot (4 bytes), presence (1), then the gate's dtype
    EXPECT_NE(error_of([&] { moe::ep::ExpertReader(bad_dtype, 3).next(); }).find("from rank 3 hold an unknown dtype"),
              std::string::npos);
  }
}

// The fuzz target's seeds (fuzz/corpus/expert_weights, written by hand to the format) parse, so
// the fuzzer starts from messages that reach every kind of tensor and scale.
TEST(ExpertWeightsWire, TheFuzzSeedsAreValidMessages) {
  const std::string dir = data_dir() + "/../../fuzz/corpus/expert_weights/";
  const std::vector<std::pair<std::string, int>> seeds = {{"float32.bin", 1}, {"fp8_blocks.bin", 1}, {"mxfp4_biases.bin", 2}};
  for (const auto& [name, experts] : seeds) {
    SCOPED_TRACE(name);
    std::ifstream in(dir + name, std::ios::binary);
    ASSERT_TRUE(in) << dir + name;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* b = reinterpret_cast<const std::byte*>(text.data());
    const Buffer message(b, b + text.size());
    moe::ep::ExpertReader reader(message, 0);
    int count = 0;
    for (; !reader.done(); ++count) reader.next();
    EXPECT_EQ(count, experts);
  }
}

TEST(ExpertMoves, PlanTakesAReplicaOnTheSlotsOwnRankFirstAndMovesOnlyChangedSlots) {
  // 6 slots over 2 ranks (0-2 on rank 0, 3-5 on rank 1); 4 experts.
  const ExpertPlacement from({0, 1, 2, 3, 0, 1}, 4);
  const ExpertPlacement to({0, 1, 1, 3, 2, 0}, 4);
  const std::vector<int32_t> owners = moe::ep::contiguous_owners(6, 2);
  const auto moves = moe::ep::plan_expert_moves(from, to, owners);
  ASSERT_EQ(moves.size(), 3u);
  EXPECT_EQ(moves[0].slot, 2);  // expert 1: slot 1 on rank 0 (slot 5 on rank 1 holds it too)
  EXPECT_EQ(moves[0].source_slot, 1);
  EXPECT_EQ(moves[1].slot, 4);  // expert 2: only slot 2, on rank 0
  EXPECT_EQ(moves[1].source_slot, 2);
  EXPECT_EQ(moves[2].slot, 5);  // expert 0: slot 4 on its own rank, not slot 0
  EXPECT_EQ(moves[2].source_slot, 4);
  EXPECT_TRUE(moe::ep::plan_expert_moves(from, from, owners).empty());
}

TEST(ExpertMoves, RanksReplacedThroughTheTransportHoldTheNewPlacementsExperts) {
  for (const char* family : {"qwen3_moe", "deepseek_v3_fp8", "gpt_oss_mxfp4"}) {
    SCOPED_TRACE(family);
    const FixtureExperts f = fixture_experts(family);
    const auto experts = static_cast<int64_t>(f.logical.size());
    moe::PhysicalExperts layer(f.logical, ExpertPlacement::initial(experts, 4), f.activation);
    // The new placement: the experts rotated by 3 slots, the last four slots replicas of 1 and 2.
    std::vector<int32_t> to;
    for (int64_t p = 0; p < experts; ++p) to.push_back(static_cast<int32_t>((p + 3) % experts));
    for (int32_t r : {1, 2, 1, 2}) to.push_back(r);
    const ExpertPlacement placement(to, experts);
    const std::vector<int32_t> owners = moe::ep::contiguous_owners(experts + 4, 4);
    const auto moves = moe::ep::plan_expert_moves(layer.placement(), placement, owners);
    moe::ep::InProcessGroup group(4);
    std::vector<moe::ep::ArrivedExperts> arrived(4);
    const auto errors = run_rank_threads(group, [&](int r) {
      arrived[static_cast<std::size_t>(r)] = moe::ep::move_expert_weights(group.rank(r), layer, moves, owners);
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    std::vector<std::pair<int32_t, SwigluExpertWeights>> slots;
    int64_t bytes = 0;
    for (int r = 0; r < 4; ++r) {
      for (const auto& [slot, w] : arrived[static_cast<std::size_t>(r)].slots) {
        EXPECT_EQ(owners[static_cast<std::size_t>(slot)], r) << "slot " << slot;  // each rank gets only its own slots
      }
      bytes += arrived[static_cast<std::size_t>(r)].bytes_received;
      std::move(arrived[static_cast<std::size_t>(r)].slots.begin(), arrived[static_cast<std::size_t>(r)].slots.end(),
                std::back_inserter(slots));
    }
    EXPECT_EQ(slots.size(), moves.size());
    EXPECT_GT(bytes, 0);
    layer.rearrange(placement, std::move(slots));
    for (int32_t p = 0; p < layer.num_physical(); ++p) {
      SCOPED_TRACE(p);
      expect_same_expert(layer.weights(p), f.logical[static_cast<std::size_t>(placement.logical_of(p))]);
    }
  }
}

TEST(ExpertMoves, WeightsThatNeverArriveOrArriveUnaskedAreRefused) {
  const FixtureExperts f = fixture_experts("qwen3_moe");
  const auto experts = static_cast<int64_t>(f.logical.size());
  moe::PhysicalExperts layer(f.logical, ExpertPlacement::initial(experts, 0), f.activation);
  std::vector<int32_t> swapped;
  for (int64_t p = 0; p < experts; ++p) swapped.push_back(static_cast<int32_t>(p));
  std::swap(swapped[0], swapped[1]);
  EXPECT_EQ(error_of([&] { layer.rearrange(ExpertPlacement(swapped, experts), {{0, f.logical[1]}}); }),
            "rearrange: slot 1 changes from expert 1 to expert 0 but its weights never arrived");
  EXPECT_EQ(layer.placement_version(), 0);
  // Rank 1 sends rank 0 the weights of slot 0, which no move gives rank 0.
  moe::ep::InProcessGroup group(2);
  const std::vector<int32_t> owners = moe::ep::contiguous_owners(experts, 2);
  const auto errors = run_rank_threads(group, [&](int r) {
    if (r == 0) {
      moe::ep::move_expert_weights(group.rank(0), layer, {}, owners);
    } else {
      std::vector<Buffer> out(2);
      moe::ep::append_expert(out[0], 0, f.logical[0]);
      group.rank(1).all_to_all(std::move(out));
    }
  });
  EXPECT_EQ(errors[0], "EPLB: rank 1 sent the weights of slot 0, which rank 0 does not take from it");
}

// On one rank a re-placement copies only the slots whose expert changes; the others keep their
// memory, and every slot then holds its new expert's weights.
TEST(ExpertMoves, ARearrangedLayerCopiesOnlyTheSlotsThatChange) {
  const FixtureExperts f = fixture_experts("qwen3_moe");
  const auto experts = static_cast<int64_t>(f.logical.size());
  moe::PhysicalExperts layer(f.logical, ExpertPlacement::initial(experts, 2), f.activation);
  std::vector<const void*> before;
  for (int32_t p = 0; p < layer.num_physical(); ++p) before.push_back(layer.weights(p).gate.raw_data());
  std::vector<int32_t> to = layer.placement().physical_to_logical();
  std::swap(to[0], to[1]);  // slots 0 and 1 trade experts; the rest keep theirs
  const ExpertPlacement placement(to, experts);
  layer.rearrange(placement);
  for (int32_t p = 0; p < layer.num_physical(); ++p) {
    SCOPED_TRACE(p);
    EXPECT_EQ(layer.weights(p).gate.raw_data() == before[static_cast<std::size_t>(p)], p >= 2);
    expect_same_expert(layer.weights(p), f.logical[static_cast<std::size_t>(placement.logical_of(p))]);
  }
}

// The controller spreads a rebalance over steps, `layers_per_step` layers after each, in layer
// order; the layers not yet moved keep their placement, and a rebalance falling due meanwhile is
// skipped.
TEST(EplbLayersPerStep, ARebalanceMovesALayerAStepAndSkipsOneFallingDueMeanwhile) {
  models::LoadOptions load;
  load.eplb.redundant_experts = 2;
  auto model = models::load_model(family_dir("qwen3_moe"), load);
  std::vector<moe::PhysicalExperts*> layers;
  std::vector<int64_t> widths;
  for (moe::MoeBlock* b : model->moe_blocks()) {
    layers.push_back(&b->experts());
    widths.push_back(b->experts().num_physical());
  }
  ASSERT_EQ(layers.size(), 3u);
  moe::EplbOptions options;
  options.redundant_experts = 2;
  options.window_steps = 4;
  options.rebalance_every = 2;
  options.layers_per_step = 1;
  std::vector<std::pair<int64_t, std::size_t>> moved;  // (step, layer)
  int64_t step = 0;
  moe::EplbController controller(options, layers, [&](moe::PhysicalExperts& layer, ExpertPlacement placement) {
    const auto j = static_cast<std::size_t>(std::find(layers.begin(), layers.end(), &layer) - layers.begin());
    moved.emplace_back(step, j);
    layer.rearrange(std::move(placement));
  });
  moe::ExpertLoads loads(widths);
  std::vector<int64_t> waiting, versions;
  for (step = 1; step <= 6; ++step) {
    for (int64_t j = 0; j < 3; ++j) {
      auto counts = loads.layer(j);
      for (std::size_t p = 0; p < counts.size(); ++p) counts[p] = p == 0 ? 50 : 1;  // expert 0 is hot
    }
    controller.end_step(loads);
    waiting.push_back(controller.layers_waiting());
    versions.push_back(layers[2]->placement_version());
  }
  // Planned at step 2 and layer 0 moved; layers 1 and 2 after steps 3 and 4; the rebalance due
  // at step 4 found layer 2 waiting and was skipped; the next is planned at step 6.
  const std::vector<std::pair<int64_t, std::size_t>> expected = {{2, 0}, {3, 1}, {4, 2}, {6, 0}};
  EXPECT_EQ(moved, expected);
  EXPECT_EQ(waiting, (std::vector<int64_t>{0, 2, 1, 0, 0, 2}));
  EXPECT_EQ(versions, (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));  // layer 2 served on its old placement until step 4
  EXPECT_EQ(controller.rebalances(), 2);
}

// The group's rebalances move weights between the ranks (bytes counted, `r3 bench --json` and
// /metrics report them), layer by layer when asked, and every request gets what it gets alone on
// one rank without EPLB.
TEST(ExpertParallelEngine, RebalancesMoveWeightsBetweenRanksLayerByLayerAndChangeNoOutput) {
  for (const int64_t layers_per_step : {0, 1}) {
    SCOPED_TRACE(layers_per_step);
    models::LoadOptions options;
    options.eplb.redundant_experts = 8;
    options.eplb.window_steps = 2;
    options.eplb.rebalance_every = 2;
    options.eplb.layers_per_step = layers_per_step;
    auto model = models::load_model(family_dir("deepseek_v3"), options);
    auto plain = models::load_model(family_dir("deepseek_v3"));
    const auto prompts = engine_prompts(12, model->info().vocab_size, 4);
    backend::Context ctx(2);
    engine::EngineOptions ep;
    ep.expert_parallel = 4;
    engine::Engine group(*model, ctx, ep);
    engine::Engine one(*plain, ctx, {});
    std::vector<engine::RequestId> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      ids.push_back(group.submit(greedy_request(prompts[i], 3 + static_cast<int64_t>(i % 4))));
    }
    const EngineResults results = engine_run_all(group);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const auto alone = run_one(one, greedy_request(prompts[i], 3 + static_cast<int64_t>(i % 4)));
      const auto& got = results.at({ids[i], 0});
      EXPECT_EQ(got.tokens, alone.tokens) << "request " << i;
      EXPECT_EQ(got.routed, alone.routed) << "request " << i;
    }
    EXPECT_GT(group.stats().expert_weight_bytes_moved, 0);
    for (moe::MoeBlock* block : model->moe_blocks()) EXPECT_GT(block->experts().placement_version(), 0);
  }
}

}  // namespace
}  // namespace r3::test
