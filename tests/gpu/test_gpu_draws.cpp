// Next-token draws on the GPU (ops/cuda/token_drawer.h) against the host's (engine/host_draw.h)
// on the same logits: the same token, the same non-finite report, log-probabilities within float
// rounding, the same top lists; and the engine sampling on the GPU as on the CPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "engine/engine.h"
#include "engine/host_draw.h"
#include "engine_checks.h"
#include "models/device_decoder.h"
#include "models/registry.h"
#include "ops/cuda/token_drawer.h"
#include "test_support.h"

namespace r3::test {
namespace {

// Rows of logits to draw from: normal values, many rounded to quarter steps so that equal logits
// (ties broken by id) abound, one row of all-equal logits, and rows holding NaN or infinities.
Tensor draw_test_logits(int64_t rows, int64_t vocab, uint32_t seed) {
  Tensor t = Tensor::empty(DType::F32, {rows, vocab});
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = t.data<float>() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = normal(rng);
      row[i] = r % 3 == 1 ? std::round(v * 4.0f) / 4.0f : v;
      if (r % 7 == 5) row[i] = 1.5f;
    }
    if (r % 11 == 9) row[vocab / 2] = NAN, row[vocab / 3] = INFINITY;
    if (r % 13 == 12) row[vocab - 1] = -INFINITY;
  }
  return t;
}

TEST(GpuDraws, EveryRuleDrawsTheHostsTokenAndLogprobs) {
  auto gpu = backend::Context::cuda(0);
  ops::cuda::TokenDrawer drawer;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int64_t sampled = 0, checked = 0;
  for (const int64_t vocab : {int64_t{37}, int64_t{1000}, int64_t{151936}}) {
    const int64_t rows = 64;
    const Tensor logits = draw_test_logits(rows, vocab, static_cast<uint32_t>(vocab));
    std::vector<ops::TokenDraw> draws(static_cast<std::size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      ops::TokenDraw& d = draws[static_cast<std::size_t>(r)];
      d.draws = r % 17 != 16;
      d.temperature = r % 4 == 0 ? 0.0 : 0.3 + 0.5 * static_cast<double>(r % 5);
      d.top_k = r % 5 == 1 ? 1 + r % 40 : (r % 5 == 2 ? vocab + 3 : 0);
      d.top_p = r % 6 == 3 ? 0.05 + 0.15 * static_cast<double>(r % 7) : 1.0;
      d.min_p = r % 8 == 7 ? 0.02 * static_cast<double>(r % 9) : 0.0;
      d.uniform = r == 6 ? 0.0 : uniform(rng);
      d.logprobs = r % 3 == 0 ? -1 : (r % 3 == 1 ? 0 : std::min<int64_t>(1 + r * 17 % 1024, 1024));
    }
    std::vector<ops::DrawnToken> on_gpu(draws.size());
    drawer.draw(*gpu, backend::to_device(*gpu, logits), draws, on_gpu);
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " row " << r);
      const auto i = static_cast<std::size_t>(r);
      const ops::DrawnToken host = engine::draw_on_host(
          {logits.data<float>() + r * vocab, static_cast<std::size_t>(vocab)}, draws[i]);
      const ops::DrawnToken& dev = on_gpu[i];
      EXPECT_EQ(dev.token, host.token);
      EXPECT_EQ(dev.nonfinite_token, host.nonfinite_token);
      if (host.nonfinite_token >= 0) {
        EXPECT_EQ(std::isnan(dev.nonfinite_value), std::isnan(host.nonfinite_value));
        if (!std::isnan(host.nonfinite_value)) {
          EXPECT_EQ(dev.nonfinite_value, host.nonfinite_value);
        }
      }
      if (host.token < 0) continue;
      ++checked;
      if (draws[i].temperature > 0) ++sampled;
      if (draws[i].logprobs >= 0) {
        EXPECT_NEAR(dev.logprob, host.logprob, 1e-5 * (1 + std::fabs(host.logprob)));
      }
      ASSERT_EQ(dev.top.size(), host.top.size());
      for (std::size_t j = 0; j < host.top.size(); ++j) {
        EXPECT_EQ(dev.top[j].token, host.top[j].token) << "entry " << j;
        EXPECT_NEAR(dev.top[j].logprob, host.top[j].logprob, 1e-5 * (1 + std::fabs(host.top[j].logprob)));
      }
    }
  }
  EXPECT_GT(sampled, 60);   // the rules were exercised, not only greedy rows
  EXPECT_GT(checked, 130);
}

// A few rows drawn without top-k, top-p, min-p or top-n logprobs are spread over the GPU: the
// same bits as the one-block-per-row kernel (token, logprob, non-finite report) at temperatures
// 0, 1 and others, with and without the chosen token's logprob, on rows with ties, all-equal
// logits, NaN and infinities, uniforms at 0 and near 1, vocabularies of one partial round to
// Qwen3's; and the host's token.
TEST(GpuDraws, AFewPlainRowsSpreadOverTheGpuGiveTheOneBlockKernelsBits) {
  auto gpu = backend::Context::cuda(0);
  ops::cuda::TokenDrawer spread, one_block(false);
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int64_t sampled = 0, compared = 0;
  for (const int64_t vocab : {int64_t{37}, int64_t{1000}, int64_t{1025}, int64_t{151936}}) {
    for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{16}}) {
      const Tensor logits = draw_test_logits(rows, vocab, static_cast<uint32_t>(vocab + rows));
      std::vector<ops::TokenDraw> draws(static_cast<std::size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        ops::TokenDraw& d = draws[static_cast<std::size_t>(r)];
        d.draws = r % 15 != 14;
        const double temperatures[] = {1.0, 0.0, 0.7, 1.0, 1.3};
        d.temperature = temperatures[(r + vocab) % 5];
        d.uniform = r == 2 ? 0.0 : (r == 4 ? 0.9999999 : uniform(rng));
        d.logprobs = (r + vocab) % 3 == 0 ? -1 : 0;
      }
      const Tensor on_device = backend::to_device(*gpu, logits);
      std::vector<ops::DrawnToken> a(draws.size()), b(draws.size());
      spread.draw(*gpu, on_device, draws, a);
      one_block.draw(*gpu, on_device, draws, b);
      for (int64_t r = 0; r < rows; ++r) {
        SCOPED_TRACE(::testing::Message() << "vocab " << vocab << ", " << rows << " rows, row " << r);
        const auto i = static_cast<std::size_t>(r);
        EXPECT_EQ(a[i].token, b[i].token);
        EXPECT_EQ(std::bit_cast<uint32_t>(a[i].logprob), std::bit_cast<uint32_t>(b[i].logprob));
        EXPECT_EQ(a[i].nonfinite_token, b[i].nonfinite_token);
        EXPECT_EQ(std::bit_cast<uint32_t>(a[i].nonfinite_value), std::bit_cast<uint32_t>(b[i].nonfinite_value));
        EXPECT_TRUE(a[i].top.empty());
        const ops::DrawnToken host = engine::draw_on_host(
            {logits.data<float>() + r * vocab, static_cast<std::size_t>(vocab)}, draws[i]);
        EXPECT_EQ(a[i].token, host.token);
        ++compared;
        if (a[i].token >= 0 && draws[i].temperature > 0) ++sampled;
      }
    }
  }
  EXPECT_EQ(spread.spread_steps(), 12);  // every step took the spread kernels
  EXPECT_EQ(one_block.spread_steps(), 0);
  EXPECT_GT(sampled, 40);
  EXPECT_EQ(compared, 4 * (1 + 3 + 16));
}

// The engine on the GPU (float32 weights) samples what it samples on the CPU: the same seeds give
// the same tokens, with top-k, top-p and min-p, and the logprobs of each step within float32
// rounding of the logits' own difference.
TEST(GpuDraws, EngineSamplesAsOnTheCpu) {
  for (const std::string family : {"qwen3_moe", "gpt_oss"}) {
    SCOPED_TRACE(family);
    backend::Context cpu(2);
    auto gpu = backend::Context::cuda(0);
    auto cpu_model = models::load_model(family_dir(family));
    auto gpu_model = models::place_on_device(*gpu, models::load_model(family_dir(family)), DType::F32);
    const auto prompts = engine_prompts(6, cpu_model->info().vocab_size, 3);
    EngineResults results[2];
    for (int d = 0; d < 2; ++d) {
      engine::Engine e(d == 0 ? *cpu_model : *gpu_model, d == 0 ? cpu : *gpu, engine::EngineOptions{});
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        engine::RequestParams p;
        p.prompt = prompts[i];
        p.max_new_tokens = 8;
        p.ignore_eos = true;
        p.sampling = {.temperature = 0.6 + 0.2 * static_cast<double>(i % 3),
                      .top_p = i % 2 == 0 ? 0.9 : 1.0,
                      .top_k = static_cast<int64_t>(i % 3 == 1 ? 12 : 0),
                      .min_p = i == 4 ? 0.05 : 0.0,
                      .seed = 100 + i};
        p.n = i == 5 ? 3 : 1;
        p.logprobs = static_cast<int64_t>(i % 3);
        e.submit(p);
      }
      results[d] = engine_run_all(e);
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (const auto& [key, cpu_result] : results[0]) {
      const EngineResult& gpu_result = results[1].at(key);
      EXPECT_EQ(gpu_result.tokens, cpu_result.tokens) << "request " << key.first << " sample " << key.second;
      ASSERT_EQ(gpu_result.logprobs.size(), cpu_result.logprobs.size());
      for (std::size_t t = 0; t < cpu_result.logprobs.size(); ++t) {
        EXPECT_NEAR(gpu_result.logprobs[t], cpu_result.logprobs[t], 1e-3) << "token " << t;
      }
      ASSERT_EQ(gpu_result.top.size(), cpu_result.top.size());
    }
  }
}

}  // namespace
}  // namespace r3::test
