// Routed-experts capture across the three MoE execution paths: the paths agree, EPLB changes
// neither outputs nor captured (logical) ids, capture always precedes the EPLB map, the binder's
// start-up errors, batching with padding rows, and the capture buffer's element type.
#include <gtest/gtest.h>

#include <set>

#include "engine/generator.h"
#include "engine/step_runner.h"
#include "models/registry.h"
#include "moe/capture_binder.h"
#include "moe/modular_moe.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

using moe::MoePath;

const std::vector<std::string> kFamilies = {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v4", "kimi_linear",
                                             "kimi_k3"};
const std::vector<MoePath> kCapturingPaths = {MoePath::kModular, MoePath::kMonolithic,
                                                    MoePath::kMega};

std::vector<int32_t> reference_forward_ids(const std::string& family) {
  const Reference ref = load_reference(family, 0);
  return {ref.input_ids.begin(), ref.input_ids.end() - 1};
}

std::unique_ptr<models::CausalLM> load(const std::string& family, MoePath backend,
                                           moe::EplbOptions eplb = {}) {
  models::LoadOptions options;
  options.moe_path = backend;
  options.eplb = eplb;
  return models::load_model(family_dir(family), options);
}

// Records which layers reported, in order.
class LayerLog final : public moe::CaptureBuffer {
 public:
  void record(int64_t layer, std::span<const int32_t>, std::span<const float>, std::span<const float>) override {
    layers.push_back(layer);
  }
  std::vector<int64_t> layers;
};

struct StepResult {
  std::vector<float> logits;
  std::vector<int32_t> routed;
};

// One prefill over `ids` (all logits), then `decode` single-token steps feeding back argmax.
// `rebalances`, when given, receives how often the step runner's EPLB control re-placed experts.
std::vector<StepResult> run_steps(models::CausalLM& model, const std::vector<int32_t>& ids, int decode,
                                  const std::vector<int32_t>& forced = {}, int64_t* rebalances = nullptr) {
  backend::Context ctx(2);
  auto cache_owner = model.make_cache(1, static_cast<int64_t>(ids.size()) + decode);
  models::ModelCache& cache = *cache_owner;
  engine::StepRunner runner(model, ctx, cache, static_cast<int64_t>(ids.size()));
  std::vector<StepResult> steps;
  const auto& info = model.info();
  std::vector<int32_t> input = ids;
  for (int s = 0; s <= decode; ++s) {
    engine::RoutedExperts routed(static_cast<int64_t>(info.moe_layers.size()), info.top_k);
    Tensor logits = runner.run({{0, input, &routed, forced}}, 0, /*all_logits=*/true);
    const auto* last = logits.data<float>() + (logits.dim(0) - 1) * logits.dim(1);
    steps.push_back({{logits.data<float>(), logits.data<float>() + logits.numel()}, routed.flat()});
    input = {static_cast<int32_t>(std::max_element(last, last + logits.dim(1)) - last)};
    if (!forced.empty()) break;
  }
  if (rebalances != nullptr) *rebalances = runner.eplb() ? runner.eplb()->rebalances() : -1;
  return steps;
}

TEST(MoePaths, AllCapturingPathsAgreeBitForBit) {
  for (const auto& family : kFamilies) {
    const auto ids = reference_forward_ids(family);
    auto reference = load(family, MoePath::kModular);
    const auto expected = run_steps(*reference, ids, 4);
    for (MoePath backend : {MoePath::kMonolithic, MoePath::kMega}) {
      auto model = load(family, backend);
      const auto got = run_steps(*model, ids, 4);
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t s = 0; s < got.size(); ++s) {
        EXPECT_EQ(got[s].logits, expected[s].logits) << family << " " << moe::moe_path_name(backend) << " step " << s;
        EXPECT_EQ(got[s].routed, expected[s].routed) << family << " " << moe::moe_path_name(backend) << " step " << s;
      }
    }
  }
}

TEST(MoePaths, NonCapturingMonolithicKernelComputesTheSameWithoutCapture) {
  const auto ids = reference_forward_ids("olmoe");
  auto a = load("olmoe", MoePath::kModular), b = load("olmoe", MoePath::kMonolithicNoCapture);
  backend::Context ctx(2);
  auto logits = [&](models::CausalLM& m) {
    auto cache_owner = m.make_cache(1, static_cast<int64_t>(ids.size()));
    models::ModelCache& cache = *cache_owner;
    LayerLog log;
    models::ForwardBatch batch = models::ForwardBatch::sequence(ids, 0);
    batch.capture = &log;
    Tensor t = m.forward(ctx, batch, cache);
    return std::pair{std::vector<float>(t.data<float>(), t.data<float>() + t.numel()), log.layers};
  };
  const auto [modular, modular_layers] = logits(*a);
  const auto [nocapture, nocapture_layers] = logits(*b);
  EXPECT_EQ(modular, nocapture);
  EXPECT_EQ(modular_layers.size(), a->info().moe_layers.size());
  EXPECT_TRUE(nocapture_layers.empty());  // the kernel cannot report its routing
}

TEST(Eplb, ReplicasAndRebalancingChangeNeitherLogitsNorCapturedIds) {
  for (const auto& family : {"qwen3_moe", "mixtral", "deepseek_v4", "kimi_k3"}) {
    const auto ids = reference_forward_ids(family);
    for (MoePath backend : kCapturingPaths) {
      auto plain = load(family, backend);
      const auto expected = run_steps(*plain, ids, 6);
      for (int64_t redundant : {1, 3, 8}) {
        moe::EplbOptions eplb;
        eplb.redundant_experts = redundant;
        eplb.rebalance_every = 1;
        eplb.window_steps = 2;
        auto model = load(family, backend, eplb);
        int64_t rebalances = 0;
        const auto got = run_steps(*model, ids, 6, {}, &rebalances);
        for (std::size_t s = 0; s < got.size(); ++s) {
          EXPECT_EQ(got[s].logits, expected[s].logits) << family << " redundant " << redundant << " step " << s;
          EXPECT_EQ(got[s].routed, expected[s].routed) << family << " redundant " << redundant << " step " << s;
          for (int32_t id : got[s].routed) ASSERT_TRUE(id >= 0 && id < model->info().num_experts);
        }
        // Not vacuous: the layers really hold replicas and were re-placed every step.
        EXPECT_EQ(rebalances, 7);
        for (moe::MoeBlock* block : model->moe_blocks()) {
          EXPECT_EQ(block->experts().num_physical(), model->info().num_experts + redundant);
        }
      }
    }
  }
}

TEST(Eplb, RebalancingFollowsTheMeasuredLoad) {
  moe::EplbOptions eplb;
  eplb.redundant_experts = 4;
  eplb.rebalance_every = 1;
  auto model = load("qwen3_moe", MoePath::kModular, eplb);
  backend::Context ctx(2);
  const auto ids = reference_forward_ids("qwen3_moe");
  auto cache_owner = model->make_cache(1, static_cast<int64_t>(ids.size()));
  models::ModelCache& cache = *cache_owner;
  engine::RoutedExperts routed(3, 2);
  {
    engine::StepRunner runner(*model, ctx, cache, static_cast<int64_t>(ids.size()));
    runner.run({{0, ids, &routed, {}}});
  }
  // The most used expert of layer 0 in that step now has the most replicas.
  std::vector<int64_t> uses(8, 0);
  for (int64_t r = 0; r < routed.rows(); ++r) {
    for (int64_t k = 0; k < 2; ++k) ++uses[static_cast<std::size_t>(routed.at(r, 0, k))];
  }
  const auto busiest = static_cast<int32_t>(std::max_element(uses.begin(), uses.end()) - uses.begin());
  const auto& placement = model->moe_blocks()[0]->experts().placement();
  std::size_t most_replicas = 0;
  for (int32_t e = 0; e < 8; ++e) most_replicas = std::max(most_replicas, placement.replicas(e).size());
  EXPECT_EQ(placement.replicas(busiest).size(), most_replicas);
  EXPECT_GT(most_replicas, 1u);
}

// Replace the EPLB map of one layer with one that throws: when it throws, the capturer already
// holds that layer's logical ids. Every path on Qwen3-MoE, with and without replicas; DeepSeek-V4's
// layer 0 routes by its hash table and layer 1 by scores.
void expect_capture_before_map(const std::string& family, MoePath backend, int64_t layer,
                               moe::EplbOptions eplb = {}) {
  SCOPED_TRACE(family + " " + std::string(moe::moe_path_name(backend)) + " layer " + std::to_string(layer) +
               " redundant experts " + std::to_string(eplb.redundant_experts));
  {
    {
      auto model = load(family, backend, eplb);
      const int64_t layers = static_cast<int64_t>(model->info().moe_layers.size()), k = model->info().top_k;
      const auto ids = reference_forward_ids(family);
      const auto expected = run_steps(*model, ids, 0)[0].routed;  // [T, layers, k]
      model->moe_blocks()[static_cast<std::size_t>(layer)]->experts().set_map_function(
          [](int32_t, int64_t, int64_t) -> int32_t { throw Error("EPLB map called"); });
      backend::Context ctx(2);
      auto cache_owner = model->make_cache(1, static_cast<int64_t>(ids.size()));
      models::ModelCache& cache = *cache_owner;
      engine::StepRunner runner(*model, ctx, cache, static_cast<int64_t>(ids.size()));
      EXPECT_THROW(runner.run({{0, ids, nullptr, {}}}), Error);
      expect_captured_before_the_failed_map(runner.capturer(), layer, expected, layers, k);
    }
  }
}

TEST(CaptureOrder, CaptureHoldsLogicalIdsBeforeTheEplbMapRuns) {
  moe::EplbOptions replicas;
  replicas.redundant_experts = 3;
  replicas.rebalance_every = 1;
  for (MoePath backend : kCapturingPaths) {
    expect_capture_before_map("qwen3_moe", backend, 0);
    expect_capture_before_map("qwen3_moe", backend, 1);
    expect_capture_before_map("qwen3_moe", backend, 0, replicas);
    expect_capture_before_map("qwen3_moe", backend, 1, replicas);
  }
}

TEST(CaptureOrder, DeepseekV4MegaPathHashAndScoredLayers) {
  expect_capture_before_map("deepseek_v4", MoePath::kMega, 0);  // hash_moe: tid2eid[token]
  expect_capture_before_map("deepseek_v4", MoePath::kMega, 1);  // moe: sqrt-softplus biased top-k
}

// Kimi K3's latent MoE: the experts run on a down-projection of the hidden state, and on the mega
// path the fused experts module that takes that latent is the capture source of every MoE layer.
TEST(CaptureOrder, KimiK3LatentMoeOnEveryPath) {
  for (MoePath backend : kCapturingPaths) {
    for (int64_t layer : {0, 1, 2}) expect_capture_before_map("kimi_k3", backend, layer);
  }
}

TEST(CaptureBinder, NonCapturingMonolithicKernelFailsAtStartUp) {
  auto model = load("mixtral", MoePath::kMonolithicNoCapture);
  backend::Context ctx(1);
  auto cache_owner = model->make_cache(1, 4);
  models::ModelCache& cache = *cache_owner;
  try {
    engine::StepRunner runner(*model, ctx, cache, 4);
    FAIL() << "capture was bound to a kernel that cannot capture";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "Routed-experts capture is not supported with monolithic MoE kernel "
                 "cpu-fused-softmax-topk-nocapture.");
  }
}

// An MoE layer that offers no capture point at all.
class OpaqueMoe final : public moe::MoeBlock {
 public:
  explicit OpaqueMoe(int64_t id)
      : MoeBlock(id, std::make_shared<moe::PhysicalExperts>(
                         std::vector<moe::SwigluExpertWeights>{{Tensor::empty(DType::F32, {1, 1}),
                                                                Tensor::empty(DType::F32, {1, 1}),
                                                                Tensor::empty(DType::F32, {1, 1})}},
                         moe::ExpertPlacement::initial(1, 0))) {}
  std::string path_name() const override { return "opaque"; }
  Gate gate() const override { return {gate_weight_, gate_bias_, rule_}; }
  void forward(backend::Context&, const moe::MoeInput&, Tensor&) const override {}

 private:
  Tensor gate_weight_ = Tensor::empty(DType::F32, {1, 1}), gate_bias_;
  moe::SoftmaxTopK rule_{1, false};
};

TEST(CaptureBinder, LayerWithoutRouterOrCaptureSourceFails) {
  auto model = load("qwen3_moe", MoePath::kModular);
  std::vector<moe::MoeBlock*> layers = model->moe_blocks();
  OpaqueMoe opaque(1);
  layers[1] = &opaque;
  try {
    moe::check_routing_capture(layers);
    FAIL() << "accepted a layer with no capture point";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "No supported MoE router found for routed-experts capture.");
  }
}

TEST(CaptureBinder, EveryLayerCapturesOnceIntoTheStepsBufferAndLayerIdsAreChecked) {
  for (MoePath backend : kCapturingPaths) {
    auto model = load("qwen2_moe", backend);
    std::vector<moe::MoeBlock*> layers = model->moe_blocks();
    EXPECT_EQ(moe::check_routing_capture(layers), 3);
    backend::Context ctx(1);
    auto cache_owner = model->make_cache(1, 3);
    models::ModelCache& cache = *cache_owner;
    LayerLog log;
    models::ForwardBatch batch = models::ForwardBatch::sequence({1, 2, 3}, 0);
    batch.capture = &log;
    model->forward(ctx, batch, cache);
    EXPECT_EQ(log.layers, (std::vector<int64_t>{0, 1, 2})) << moe::moe_path_name(backend);  // once each
    layers[2] = layers[1];  // a layer id twice
    EXPECT_THROW(moe::check_routing_capture(layers), Error);
  }
}

TEST(CaptureBinder, AStepWithoutACaptureBufferCannotRunACapturingPath) {
  for (MoePath backend : kCapturingPaths) {
    auto model = load("qwen2_moe", backend);
    backend::Context ctx(1);
    auto cache = model->make_cache(1, 3);
    try {
      model->forward(ctx, models::ForwardBatch::sequence({1, 2, 3}, 0), *cache);
      FAIL() << "ran MoE layers without a capture buffer on " << moe::moe_path_name(backend);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("without a capture buffer"), std::string::npos) << e.what();
    }
  }
}

// Two sequences and padding rows in one step: each sequence gets exactly the rows (and
// logits) it gets when it runs alone; padding is never attributed.
TEST(StepRunner, BatchedSequencesWithPaddingGetTheirOwnRows) {
  auto model = load("qwen3_moe", MoePath::kModular);
  const Reference r0 = load_reference("qwen3_moe", 0), r1 = load_reference("qwen3_moe", 1);
  const std::vector<int32_t> a(r0.input_ids.begin(), r0.input_ids.begin() + 6);
  const std::vector<int32_t> b(r1.input_ids.begin(), r1.input_ids.begin() + 4);
  backend::Context ctx(2);
  auto solo = [&](const std::vector<int32_t>& ids) {
    auto cache_owner = model->make_cache(1, 16);
    models::ModelCache& cache = *cache_owner;
    engine::StepRunner runner(*model, ctx, cache, 16);
    engine::RoutedExperts routed(3, 2);
    Tensor logits = runner.run({{0, ids, &routed, {}}});
    runner.run({{0, {7}, &routed, {}}});
    return std::pair{std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel()), routed.flat()};
  };
  const auto [logits_a, routed_a] = solo(a);
  const auto [logits_b, routed_b] = solo(b);

  auto cache_owner = model->make_cache(2, 16);

  models::ModelCache& cache = *cache_owner;
  engine::StepRunner runner(*model, ctx, cache, 16);
  engine::RoutedExperts ra(3, 2), rb(3, 2);
  Tensor logits = runner.run({{0, a, &ra, {}}, {1, b, &rb, {}}}, /*padding_rows=*/3);
  EXPECT_EQ(runner.capturer().tokens(), 6 + 4 + 3);
  runner.run({{1, {7}, &rb, {}}, {0, {7}, &ra, {}}}, /*padding_rows=*/1);
  const int64_t v = logits.dim(1);
  EXPECT_EQ(std::vector<float>(logits.data<float>(), logits.data<float>() + v), logits_a);
  EXPECT_EQ(std::vector<float>(logits.data<float>() + v, logits.data<float>() + 2 * v), logits_b);
  EXPECT_EQ(ra.flat(), routed_a);
  EXPECT_EQ(rb.flat(), routed_b);
  EXPECT_EQ(ra.rows(), 7);
  EXPECT_EQ(rb.rows(), 5);
}

// A device step hands back every layer's rows at once ([tokens, layers, k] ids, [layers, tokens,
// k] weights, [tokens, layers] margins): record_layers keeps exactly what one record() per layer
// keeps (ids in both element types, weights, margins), layer by layer for a step that routed only
// some layers, and refuses an id outside the experts naming its layer.
TEST(RoutingCapturer, AllLayersAtOnceEqualOneRecordPerLayer) {
  for (const int64_t experts : {40, 300}) {
    const int64_t tokens = 3, layers = 4, k = 2;
    std::vector<int32_t> ids(static_cast<std::size_t>(tokens * layers * k));
    std::vector<float> weights(ids.size()), margins(static_cast<std::size_t>(tokens * layers));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + 11) % static_cast<std::size_t>(experts));
      weights[i] = 0.01f * static_cast<float>(i);
    }
    for (std::size_t i = 0; i < margins.size(); ++i) margins[i] = 0.5f + static_cast<float>(i);
    for (const int64_t routed : {layers, int64_t{2}}) {
      moe::RoutingCapturer bulk(8, layers, k, experts, true), each(8, layers, k, experts, true);
      bulk.begin_step(tokens);
      each.begin_step(tokens);
      bulk.record_layers(routed, layers, tokens, k, ids, weights, margins);
      for (int64_t j = 0; j < routed; ++j) {
        std::vector<int32_t> layer_ids;
        std::vector<float> layer_weights, layer_margins;
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t c = 0; c < k; ++c) {
            layer_ids.push_back(ids[static_cast<std::size_t>((t * layers + j) * k + c)]);
            layer_weights.push_back(weights[static_cast<std::size_t>((j * tokens + t) * k + c)]);
          }
          layer_margins.push_back(margins[static_cast<std::size_t>(t * layers + j)]);
        }
        each.record(j, layer_ids, layer_weights, layer_margins);
      }
      for (int64_t j = 0; j < layers; ++j) EXPECT_EQ(bulk.recorded(j), j < routed) << "layer " << j;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < routed; ++j) {
          EXPECT_EQ(bulk.margin(t, j), each.margin(t, j));
          for (int64_t c = 0; c < k; ++c) {
            EXPECT_EQ(bulk.id(t, j, c), each.id(t, j, c)) << experts << " experts, token " << t << " layer " << j;
            EXPECT_EQ(bulk.weight(t, j, c), each.weight(t, j, c));
          }
        }
      }
    }
    std::vector<int32_t> bad = ids;
    bad[static_cast<std::size_t>((1 * layers + 3) * k)] = static_cast<int32_t>(experts);  // token 1, layer 3
    moe::RoutingCapturer c(8, layers, k, experts);
    c.begin_step(tokens);
    const std::string error = error_of([&] { c.record_layers(layers, layers, tokens, k, bad, weights, margins); });
    EXPECT_NE(error.find("capture: layer 3 reported expert " + std::to_string(experts)), std::string::npos) << error;
  }
}

TEST(RoutingCapturer, NarrowestElementType) {
  EXPECT_EQ(moe::RoutingCapturer(4, 3, 2, 8).element_size(), 1u);
  EXPECT_EQ(moe::RoutingCapturer(4, 3, 2, 256).element_size(), 1u);
  EXPECT_EQ(moe::RoutingCapturer(4, 3, 2, 257).element_size(), 2u);
  moe::RoutingCapturer c(4, 2, 2, 300);
  c.begin_step(1);
  auto sink = [&](int64_t layer, std::vector<int32_t> ids, std::vector<float> weights) { c.record(layer, ids, weights, {}); };
  sink(0, std::vector<int32_t>{299, 5}, std::vector<float>{0.5f, 0.5f});
  sink(1, std::vector<int32_t>{0, 256}, std::vector<float>{0.5f, 0.5f});
  c.end_step();
  EXPECT_EQ(c.id(0, 0, 0), 299);
  EXPECT_EQ(c.id(0, 1, 1), 256);
  EXPECT_THROW(sink(1, std::vector<int32_t>{0, 1}, std::vector<float>{0.5f, 0.5f}), Error);  // twice
  c.begin_step(1);
  EXPECT_THROW(sink(0, std::vector<int32_t>{300, 1}, std::vector<float>{0.5f, 0.5f}), Error);  // not logical
  EXPECT_THROW(c.end_step(), Error);  // layer 1 missing
  EXPECT_THROW(c.begin_step(5), Error);  // beyond the preallocated rows
}

// The EPLB map counts a step's tokens per physical expert into the step's loads, padding rows
// excluded; the model keeps no count of its own.
TEST(Eplb, MapCountsTheStepsTokensPerPhysicalExpertWithoutPadding) {
  std::vector<moe::SwigluExpertWeights> experts;
  for (int e = 0; e < 3; ++e) {
    experts.push_back({Tensor::empty(DType::F32, {2, 2}), Tensor::empty(DType::F32, {2, 2}), Tensor::empty(DType::F32, {2, 2})});
  }
  const moe::PhysicalExperts layer(std::move(experts), moe::ExpertPlacement::initial(3, 1));  // physical expert 3 replicates expert 0
  backend::Workspace workspace;
  moe::Routing routing = moe::Routing::in(workspace, 3, 2);
  const int32_t ids[] = {0, 1, 0, 2, 1, 2};  // token 2 is padding
  std::copy(std::begin(ids), std::end(ids), routing.expert_ids.begin());
  LayerLog log;
  const moe::CapturedRouting captured = moe::capture(routing, 0, &log);
  moe::ExpertLoads loads({layer.num_physical()});
  const std::vector<uint8_t> padding = {0, 0, 1};
  const moe::PhysicalRouting physical = layer.map(workspace, captured, {loads.layer(0), padding});
  std::vector<int64_t> want(4, 0);
  for (std::size_t i = 0; i < 4; ++i) ++want[static_cast<std::size_t>(physical.physical_ids[i])];  // tokens 0 and 1
  EXPECT_EQ(std::vector<int64_t>(loads.layer(0).begin(), loads.layer(0).end()), want);
  EXPECT_EQ(want[0] + want[3], 2);  // expert 0 twice, over its two replicas
  EXPECT_EQ(log.layers, std::vector<int64_t>{0});
}

}  // namespace
}  // namespace r3::test
