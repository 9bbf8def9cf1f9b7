// One step over several sequences: replayed and freely routed sequences share a step and each
// gets exactly its solo result; a sequence that cannot run is refused alone.
#include <gtest/gtest.h>

#include "engine/step_runner.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

using moe::MoePath;

struct Outcome {
  std::vector<float> logits;  // of the sequence's last token
  std::vector<int32_t> routed;
};

std::unique_ptr<models::CausalLM> load(MoePath backend) {
  models::LoadOptions options;
  options.moe_path = backend;
  return models::load_model(family_dir("qwen3_moe"), options);
}

std::vector<int32_t> prompt(int index, std::size_t length) {
  const Reference r = load_reference("qwen3_moe", index);
  return {r.input_ids.begin(), r.input_ids.begin() + static_cast<std::ptrdiff_t>(length)};
}

// `ids` alone in a fresh cache.
Outcome solo(models::CausalLM& model, const std::vector<int32_t>& ids, const std::vector<int32_t>& forced) {
  backend::Context ctx(2);
  auto cache = model.make_cache(1, 16);
  engine::StepRunner runner(model, ctx, *cache, 16);
  engine::RoutedExperts routed(3, 2);
  const Tensor logits = runner.run({{0, ids, &routed, forced}});
  return {{logits.data<float>(), logits.data<float>() + logits.numel()}, routed.flat()};
}

// Another valid routing of the same shape: every id moved to the next expert (mod E), so the
// experts of a row stay distinct and differ from the router's own choice.
std::vector<int32_t> shifted(std::vector<int32_t> ids, int32_t experts) {
  for (int32_t& id : ids) id = (id + 1) % experts;
  return ids;
}

class MixedStep : public ::testing::TestWithParam<MoePath> {};

TEST_P(MixedStep, ReplayedAndFreeSequencesEachGetTheirSoloResult) {
  auto model = load(GetParam());
  const std::vector<int32_t> a = prompt(0, 6), b = prompt(1, 4);
  const int32_t experts = static_cast<int32_t>(model->info().num_experts);
  const std::vector<int32_t> forced_a = shifted(solo(*model, a, {}).routed, experts);
  const Outcome solo_a = solo(*model, a, forced_a), solo_b = solo(*model, b, {});
  ASSERT_EQ(solo_a.routed, forced_a) << "replay must route as forced";
  ASSERT_NE(solo_a.logits, solo(*model, a, {}).logits) << "the forced routing must change the result";

  backend::Context ctx(2);
  auto cache = model->make_cache(2, 16);
  engine::StepRunner runner(*model, ctx, *cache, 16);
  engine::RoutedExperts ra(3, 2), rb(3, 2);
  // Free sequence first, replayed second, then padding rows: every row kind in one step.
  const Tensor logits = runner.run({{1, b, &rb, {}}, {0, a, &ra, forced_a}}, /*padding_rows=*/2);
  const int64_t v = logits.dim(1);
  EXPECT_EQ(std::vector<float>(logits.data<float>(), logits.data<float>() + v), solo_b.logits);
  EXPECT_EQ(std::vector<float>(logits.data<float>() + v, logits.data<float>() + 2 * v), solo_a.logits);
  EXPECT_EQ(rb.flat(), solo_b.routed);
  EXPECT_EQ(ra.flat(), solo_a.routed);
}

TEST_P(MixedStep, ABadSequenceIsRefusedAloneAndTheOthersRun) {
  auto model = load(GetParam());
  const std::vector<int32_t> a = prompt(0, 6);
  const Outcome solo_a = solo(*model, a, {});
  std::vector<int32_t> duplicate(3 * 3 * 2, 0);  // 3 tokens x 3 MoE layers x top-2, expert 0 twice

  backend::Context ctx(2);
  auto cache = model->make_cache(4, 16);
  engine::StepRunner runner(*model, ctx, *cache, 32);
  engine::RoutedExperts ra(3, 2), rb(3, 2), rc(3, 2), rd(3, 2);
  std::vector<engine::StepSequence> step = {{1, {5, 320, 7}, &rb, {}},  // 320: outside the vocabulary
                                            {0, a, &ra, {}},
                                            {2, {5, 6, 7}, &rc, duplicate},
                                            {3, std::vector<int32_t>(17, 1), &rd, {}}};  // past capacity 16
  const Tensor logits = runner.run_each(step);
  EXPECT_TRUE(step[1].error.empty()) << step[1].error;
  EXPECT_NE(step[0].error.find("outside the vocabulary"), std::string::npos) << step[0].error;
  EXPECT_NE(step[2].error.find("appears twice"), std::string::npos) << step[2].error;
  EXPECT_NE(step[3].error.find("capacity"), std::string::npos) << step[3].error;
  const int64_t v = logits.dim(1);
  ASSERT_EQ(logits.dim(0), 4);
  EXPECT_EQ(std::vector<float>(logits.data<float>() + v, logits.data<float>() + 2 * v), solo_a.logits);
  EXPECT_EQ(ra.flat(), solo_a.routed);
  for (int32_t seq : {1, 2, 3}) EXPECT_EQ(cache->length(seq), 0) << "a refused sequence must not touch its cache";
  EXPECT_EQ(rb.rows() + rc.rows() + rd.rows(), 0);
  // run() refuses the same step as a whole, naming the problem.
  try {
    runner.run({{1, {5, 320, 7}, &rb, {}}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
}

// Capture travels with each step, not bound into the model: two engines over one model, stepping
// in turn, each get exactly their own rows.
TEST_P(MixedStep, TwoEnginesOverOneModelDoNotSeeEachOthersRouting) {
  auto model = load(GetParam());
  const std::vector<int32_t> a = prompt(0, 6), b = prompt(1, 4);
  auto solo_rows = [&](const std::vector<int32_t>& ids) {
    backend::Context ctx(1);
    auto cache = model->make_cache(1, 16);
    engine::StepRunner runner(*model, ctx, *cache, 16);
    engine::RoutedExperts routed(3, 2);
    runner.run({{0, ids, &routed, {}}});
    runner.run({{0, {9}, &routed, {}}});
    return routed.flat();
  };
  backend::Context ctx(2);
  auto cache_a = model->make_cache(1, 16), cache_b = model->make_cache(1, 16);
  engine::StepRunner first(*model, ctx, *cache_a, 16), second(*model, ctx, *cache_b, 16);
  engine::RoutedExperts ra(3, 2), rb(3, 2);
  first.run({{0, a, &ra, {}}});
  second.run({{0, b, &rb, {}}});
  first.run({{0, {9}, &ra, {}}});
  second.run({{0, {9}, &rb, {}}});
  EXPECT_EQ(ra.flat(), solo_rows(a));
  EXPECT_EQ(rb.flat(), solo_rows(b));
}

// The runner keeps its logits buffer across steps (page-locked on a GPU), but never writes over
// logits a caller still holds: those of a first step keep their values through a second; once
// released, the buffer is used again instead of a new allocation.
TEST(StepRunnerLogits, ABufferIsReusedOnlyOnceTheCallerHasLetGoOfIt) {
  const auto model = load(MoePath::kModular);
  backend::Context ctx(2);
  auto cache = model->make_cache(2, 16);
  engine::StepRunner runner(*model, ctx, *cache, 16);
  engine::RoutedExperts ra(3, 2), rb(3, 2);
  const Tensor first = runner.run({{0, prompt(0, 6), &ra, {}}, {1, prompt(1, 4), &rb, {}}});
  const std::vector<float> kept(first.data<float>(), first.data<float>() + first.numel());
  const void* held = first.raw_data();
  const void* second_data = nullptr;
  {
    const Tensor second = runner.run({{0, {7}, &ra, {}}, {1, {9}, &rb, {}}});
    second_data = second.raw_data();
    EXPECT_NE(second_data, held) << "the second step wrote where the first step's logits are still held";
  }
  EXPECT_EQ(std::vector<float>(first.data<float>(), first.data<float>() + first.numel()), kept);
  const Tensor third = runner.run({{0, {11}, &ra, {}}, {1, {13}, &rb, {}}});
  EXPECT_EQ(third.raw_data(), second_data) << "a released buffer was not reused";
}

INSTANTIATE_TEST_SUITE_P(Paths, MixedStep,
                         ::testing::Values(MoePath::kModular, MoePath::kMonolithic, MoePath::kMega),
                         [](const auto& p) { return std::string(moe::moe_path_name(p.param)); });

}  // namespace
}  // namespace r3::test
