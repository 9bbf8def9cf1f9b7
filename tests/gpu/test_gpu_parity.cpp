// The whole model on the GPU against the Hugging Face references, through the r3 command line
// with --device cuda, with the CPU suite's oracle and tolerances (tests/reference_checks.h):
// logits within 1e-4, every row's routed experts and weights, greedy tokens. Also: replay on the
// GPU (the forced ids are what is captured, and the logits follow the CPU's), several prompts
// batched in one engine, and the clear refusals for what has no CUDA kernels yet.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/step_runner.h"
#include "io/safetensors.h"
#include "models/device_decoder.h"
#include "models/kv_cache.h"
#include "models/registry.h"
#include "moe/moe_path.h"
#include "moe/routing_capturer.h"
#include "engine_checks.h"
#include "reference_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

struct GpuCase {
  std::string family;
  int index;
};

void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.family << " sequence " << c.index; }

std::vector<GpuCase> gpu_cases() {
  std::vector<GpuCase> cases;
  for (const std::string family :
       {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "gpt_oss", "deepseek_v2", "deepseek_v3",
        // Published quantized layouts, placed as stored: FP8 with 128x128 blocks (partial ones at
        // these sizes) and 16x16 blocks, and GPT-OSS's MXFP4 experts.
        "qwen3_moe_fp8", "deepseek_v3_fp8", "deepseek_v3_fp8_b16", "gpt_oss_mxfp4",
        // Kimi Delta Attention layers beside latent attention without rotary (heads of 16 and
        // 32, convolutions of 4 and 3 taps), and Kimi Linear's FP8 layout.
        "kimi_linear", "kimi_linear_alt", "kimi_linear_fp8",
        // Kimi K3: attention residuals, gated latent attention, KDA with the bounded forget gate
        // and full-rank output gate, SiTU latent MoE.
        "kimi_k3", "kimi_k3_alt"}) {
    for (int index : {0, 1}) cases.push_back({family, index});
  }
  return cases;
}

class GpuParity : public testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override { ref_ = load_reference(GetParam().family, GetParam().index); }
  std::string model_flags() const { return " --device cuda --dtype float32 --model " + family_dir(GetParam().family); }
  Reference ref_;
};

TEST_P(GpuParity, ForwardMatchesReference) {
  TempDir tmp;
  const std::string dump = tmp.path("dump.safetensors");
  const CommandResult run =
      run_r3("forward -q" + model_flags() + " --ids " + join(forward_ids(ref_)) + " --dump " + dump);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_forward_dump_matches(ref_, dump);
}

TEST_P(GpuParity, GenerateMatchesReference) {
  const CommandResult run = run_r3("generate -q --json --ignore-eos" + model_flags() + " --ids " +
                                   join(prompt_ids(ref_)) + " --max-new-tokens " +
                                   std::to_string(ref_.generated.size()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_generate_output_matches(ref_, run.out);
}

// Routing margins from the routing kernel equal the CPU rules' (float32 weights): every row of a
// greedy run, within 1e-5 (the scores themselves agree to the last bit or within one rounding).
TEST_P(GpuParity, RoutingMarginsFollowTheCpu) {
  const std::vector<int64_t> prompt64 = prompt_ids(ref_);
  engine::RequestParams p = greedy_request(std::vector<int32_t>(prompt64.begin(), prompt64.end()),
                                           static_cast<int64_t>(ref_.generated.size()));
  p.return_routing_margins = true;
  const auto margins_on = [&](models::CausalLM& model, backend::Context& ctx) {
    engine::Engine e(model, ctx);
    return run_one(e, p).margins;
  };
  backend::Context cpu(2);
  auto cpu_model = models::load_model(family_dir(GetParam().family));
  auto gpu = backend::Context::cuda(0);
  auto gpu_model = models::place_on_device(*gpu, models::load_model(family_dir(GetParam().family)), DType::F32);
  const std::vector<float> want = margins_on(*cpu_model, cpu), got = margins_on(*gpu_model, *gpu);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(static_cast<int64_t>(got.size()), ref_.tokens * ref_.layers);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::abs(want[i]))) << "row " << i / ref_.layers;
  }
}

// The three MoE paths the GPU runs (--moe-path mega, the default; modular; monolithic) on a
// greedy run: the decode steps of one token take the pair-by-pair experts, the grouped kernels
// and one kernel a MoE layer. Every logprob, routed expert and routing margin is bit-identical,
// with float32 and bf16 weights.
TEST_P(GpuParity, EveryMoePathGivesTheSameBits) {
  const std::vector<int64_t> prompt64 = prompt_ids(ref_);
  engine::RequestParams p = greedy_request(std::vector<int32_t>(prompt64.begin(), prompt64.end()),
                                           static_cast<int64_t>(ref_.generated.size()));
  p.return_routing_margins = true;
  auto gpu = backend::Context::cuda(0);
  for (const DType weights : {DType::F32, DType::BF16}) {
    const auto run_on = [&](moe::MoePath path) {
      auto model = models::place_on_device(*gpu, models::load_model(family_dir(GetParam().family)), weights, path);
      engine::Engine e(*model, *gpu);
      return run_one(e, p);
    };
    const EngineResult mega = run_on(moe::MoePath::kMega);
    ASSERT_EQ(mega.margins.size(), static_cast<std::size_t>(ref_.tokens * ref_.layers));
    const auto same_bits = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    for (const moe::MoePath path : {moe::MoePath::kModular, moe::MoePath::kMonolithic}) {
      const EngineResult other = run_on(path);
      const std::string what = " on " + std::string(moe::moe_path_name(path)) + " with " +
                               std::string(dtype_name(weights)) + " weights";
      EXPECT_EQ(other.tokens, mega.tokens) << what;
      EXPECT_TRUE(same_bits(other.logprobs, mega.logprobs)) << "logprobs" << what;
      EXPECT_EQ(other.routed, mega.routed) << what;
      EXPECT_TRUE(same_bits(other.margins, mega.margins)) << "margins" << what;
    }
  }
}

// A routing unlike the model's own (each reference id moved to the next expert not already in
// its row), replayed on the GPU and on the CPU: both capture exactly the forced ids, and the GPU's
// logits follow the CPU's.
TEST_P(GpuParity, ReplayedRoutingIsCapturedAndMatchesTheCpu) {
  const auto model_dir = family_dir(GetParam().family);
  const std::vector<int64_t> ids64 = forward_ids(ref_);
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  const auto tokens = static_cast<int64_t>(ids.size());
  std::vector<int32_t> forced;
  auto host_model = models::load_model(model_dir);
  const int64_t experts = host_model->info().num_experts;
  for (int64_t row = 0; row < tokens * ref_.layers; ++row) {
    std::vector<int32_t> chosen;
    for (int64_t c = 0; c < ref_.top_k; ++c) {
      auto e = static_cast<int32_t>((ref_.topk_ids[row * ref_.top_k + c] + 1) % experts);
      while (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) e = static_cast<int32_t>((e + 1) % experts);
      chosen.push_back(e);
    }
    forced.insert(forced.end(), chosen.begin(), chosen.end());
  }
  auto run = [&](models::CausalLM& model, backend::Context& ctx) {
    auto cache = model.make_cache(1, tokens);
    engine::StepRunner runner(model, ctx, *cache, tokens);
    engine::RoutedExperts routed(ref_.layers, ref_.top_k);
    Tensor logits = runner.run({{0, ids, &routed, forced}}, 0, /*all_logits=*/true);
    return std::make_pair(float_values(logits), routed.flat());
  };
  backend::Context cpu(2);
  const auto [cpu_logits, cpu_routed] = run(*host_model, cpu);
  auto gpu = backend::Context::cuda(0);
  auto device_model = models::place_on_device(*gpu, models::load_model(model_dir), DType::F32);
  const auto [gpu_logits, gpu_routed] = run(*device_model, *gpu);
  EXPECT_EQ(cpu_routed, forced);
  EXPECT_EQ(gpu_routed, forced);
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < cpu_logits.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(gpu_logits[i]) - cpu_logits[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(cpu_logits[i])));
  }
  EXPECT_LE(err / scale, 1e-4) << "max |gpu - cpu| = " << err << ", max |cpu| = " << scale;
}

// The generated tokens of `ref` that bf16 weights can be held to: all of them, or those before
// the first step whose reference logits have their best two within bfloat16's resolution (unit
// roundoff 2^-8 of the row's largest magnitude); rounding every weight to bf16 may flip that
// step's choice, and the continuation then follows another context.
std::size_t tokens_within_bf16_resolution(const Reference& ref) {
  for (std::size_t i = 0; i < ref.generated.size(); ++i) {
    const auto row = ref.logits.begin() + static_cast<std::ptrdiff_t>((ref.prompt_len - 1 + static_cast<int64_t>(i)) * ref.vocab);
    double best = -INFINITY, second = -INFINITY, largest = 0;
    for (auto v = row; v != row + ref.vocab; ++v) {
      largest = std::max(largest, std::fabs(*v));
      if (*v > best) {
        second = best;
        best = *v;
      } else {
        second = std::max(second, *v);
      }
    }
    if (best - second < std::ldexp(largest, -8)) return i;
  }
  return ref.generated.size();
}

// Bfloat16 weights (the default on the GPU; these fixtures store float32, so every projection the
// checkpoint does not publish quantized is rounded, and the KV pools hold bf16): the greedy tokens
// stay the reference's, up to a step whose reference logits have their best two within bf16's
// resolution (printed when one is met). A token may differ before that only after a routed row
// where the bf16 run chose other experts: rounding may flip a selection whose margin is small
// (DeepSeek-V3's group scores too, which the per-row margin printed does not see), and what follows
// runs other experts; that row and its reference margin (from the CPU) are printed. The count of
// routed rows that differ is printed for the record.
TEST_P(GpuParity, Bf16WeightsKeepTheGreedyTokens) {
  const CommandResult run = run_r3("generate -q --json --ignore-eos --device cuda --model " +
                                   family_dir(GetParam().family) + " --ids " + join(prompt_ids(ref_)) +
                                   " --max-new-tokens " + std::to_string(ref_.generated.size()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto out = nlohmann::json::parse(run.out);
  const auto output = out.at("output_ids").get<std::vector<int64_t>>();
  ASSERT_EQ(output.size(), ref_.generated.size());
  const auto& routed = out.at("routed_experts");
  ASSERT_EQ(static_cast<int64_t>(routed.size()), ref_.tokens);
  const auto row_differs = [&](int64_t t, int64_t l) {
    auto ours = routed[static_cast<std::size_t>(t)][static_cast<std::size_t>(l)].get<std::vector<int64_t>>();
    auto first = ref_.topk_ids.begin() + (t * ref_.layers + l) * ref_.top_k;
    std::vector<int64_t> theirs(first, first + ref_.top_k);
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    return ours != theirs;
  };
  // The tokens the reference fixes (greedy_tokens_fixed_by), up to bf16's resolution.
  const std::vector<int64_t> fixed = greedy_tokens_fixed_by(ref_);
  const std::size_t held = std::min(tokens_within_bf16_resolution(ref_), fixed.size());
  std::size_t first_different = 0;
  while (first_different < held && output[first_different] == fixed[first_different]) ++first_different;
  if (first_different < held) {
    // The first routed row that differs among those generated token first_different depends on.
    int64_t flip_row = -1, flip_layer = -1;
    for (int64_t t = 0; t < ref_.prompt_len + static_cast<int64_t>(first_different) && flip_row < 0; ++t) {
      for (int64_t l = 0; l < ref_.layers && flip_row < 0; ++l) {
        if (row_differs(t, l)) flip_row = t, flip_layer = l;
      }
    }
    EXPECT_GE(flip_row, 0) << "generated token " << first_different << " is " << output[first_different]
                           << ", the reference's " << fixed[first_different]
                           << ", with every routed row before it the reference's";
    if (flip_row >= 0) {
      backend::Context cpu(2);
      auto cpu_model = models::load_model(family_dir(GetParam().family));
      engine::Engine e(*cpu_model, cpu);
      engine::RequestParams p = greedy_request(std::vector<int32_t>(ref_.input_ids.begin(), ref_.input_ids.end()), 1);
      p.return_routing_margins = true;
      const std::vector<float> margins = run_one(e, p).margins;
      const auto at = static_cast<std::size_t>(flip_row * ref_.layers + flip_layer);
      std::printf("[ bf16     ] %s sequence %d: generated token %zu differs after routed row %lld (MoE layer %lld), "
                  "whose reference margin is %.2e\n",
                  GetParam().family.c_str(), GetParam().index, first_different + 1, static_cast<long long>(flip_row),
                  static_cast<long long>(flip_layer), at < margins.size() ? static_cast<double>(margins[at]) : NAN);
    }
  }
  if (held < fixed.size()) {
    std::printf("[ bf16     ] %s sequence %d: generated token %zu has a reference margin below bf16 resolution; "
                "tokens compared up to it (%s after it)\n",
                GetParam().family.c_str(), GetParam().index, held + 1,
                std::equal(fixed.begin(), fixed.end(), output.begin()) ? "equal" : "different");
  }
  // Rows whose input tokens are the reference's (after a flipped token the contexts differ; a
  // reference whose generate left its forward fixes the prompt's rows only).
  const int64_t rows = std::min(routed_rows_fixed_by(ref_),
                                ref_.prompt_len + static_cast<int64_t>(std::min(held, first_different)));
  int64_t differing = 0;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t l = 0; l < ref_.layers; ++l) differing += row_differs(t, l);
  }
  std::printf("[ bf16     ] %s sequence %d: %lld of %lld routed rows differ from the float64 reference\n",
              GetParam().family.c_str(), GetParam().index, static_cast<long long>(differing),
              static_cast<long long>(rows * ref_.layers));
}

std::string gpu_case_name(const testing::TestParamInfo<GpuCase>& param_info) {
  return param_info.param.family + "_seq" + std::to_string(param_info.param.index);
}

INSTANTIATE_TEST_SUITE_P(Families, GpuParity, testing::ValuesIn(gpu_cases()), gpu_case_name);

// Both reference prompts in one engine run on the GPU (batched decode steps, paged KV blocks on
// the device): each gets the reference's greedy tokens and routed experts for the tokens both
// references generate, as far as the reference fixes them (greedy_tokens_fixed_by).
TEST(GpuEngine, TwoPromptsBatchedMatchTheirReferences) {
  for (const std::string family : {"qwen3_moe", "gpt_oss", "kimi_linear", "kimi_k3"}) {
    const Reference a = load_reference(family, 0), b = load_reference(family, 1);
    const std::size_t gen = std::min(a.generated.size(), b.generated.size());
    const CommandResult run =
        run_r3("generate -q --json --ignore-eos --device cuda --dtype float32 --model " + family_dir(family) + " --ids " +
               join(prompt_ids(a)) + " --ids " + join(prompt_ids(b)) + " --max-new-tokens " + std::to_string(gen));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    std::istringstream lines(run.out);
    for (const Reference* ref : {&a, &b}) {
      std::string line;
      ASSERT_TRUE(std::getline(lines, line)) << family;
      const auto out = nlohmann::json::parse(line);
      const auto output = out.at("output_ids").get<std::vector<int64_t>>();
      ASSERT_EQ(output.size(), gen) << family;
      const std::vector<int64_t> fixed = greedy_tokens_fixed_by(*ref);
      const std::size_t tokens = std::min(gen, fixed.size());
      EXPECT_EQ(std::vector<int64_t>(output.begin(), output.begin() + static_cast<std::ptrdiff_t>(tokens)),
                std::vector<int64_t>(fixed.begin(), fixed.begin() + static_cast<std::ptrdiff_t>(tokens)))
          << family;
      const auto& routed = out.at("routed_experts");
      ASSERT_EQ(routed.size(), static_cast<std::size_t>(ref->prompt_len) + gen - 1) << family;
      const auto rows = std::min(routed.size(), static_cast<std::size_t>(routed_rows_fixed_by(*ref)));
      for (std::size_t t = 0; t < rows; ++t) {
        for (int64_t l = 0; l < ref->layers; ++l) {
          auto ours = routed[t][static_cast<std::size_t>(l)].get<std::vector<int64_t>>();
          auto first = ref->topk_ids.begin() + (static_cast<int64_t>(t) * ref->layers + l) * ref->top_k;
          std::vector<int64_t> theirs(first, first + ref->top_k);
          std::sort(ours.begin(), ours.end());
          std::sort(theirs.begin(), theirs.end());
          EXPECT_EQ(ours, theirs) << family << " row " << t << " MoE layer " << l;
        }
      }
    }
  }
}

// Decode steps replay as one CUDA graph each, capture included: of 8 greedy steps after the
// prefill, the first runs eagerly, the second is captured and launched, and the rest are
// launched; the tokens and routed rows are the reference's all the same.
TEST(GpuGraphs, DecodeStepsReplayAsOneGraphWithCaptureOn) {
  const Reference ref = load_reference("qwen3_moe", 0);
  auto gpu = backend::Context::cuda(0);
  auto model = models::place_on_device(*gpu, models::load_model(family_dir("qwen3_moe")), DType::F32);
  const std::vector<int64_t> prompt64 = prompt_ids(ref);
  const std::vector<int32_t> prompt(prompt64.begin(), prompt64.end());
  engine::GenerateOptions options;
  options.max_new_tokens = static_cast<int64_t>(ref.generated.size());
  const engine::GenerateResult gen = engine::generate(*model, *gpu, prompt, options);
  EXPECT_EQ(std::vector<int64_t>(gen.output_ids.begin(), gen.output_ids.end()), ref.generated);
  ASSERT_EQ(gen.routed_experts.rows(), ref.tokens);
  for (int64_t t = 0; t < ref.tokens; ++t) {
    for (int64_t l = 0; l < ref.layers; ++l) {
      std::vector<int64_t> ours, theirs;
      for (int64_t c = 0; c < ref.top_k; ++c) {
        ours.push_back(gen.routed_experts.at(t, l, c));
        theirs.push_back(ref.topk_ids[(t * ref.layers + l) * ref.top_k + c]);
      }
      std::sort(ours.begin(), ours.end());
      std::sort(theirs.begin(), theirs.end());
      EXPECT_EQ(ours, theirs) << "row " << t << " MoE layer " << l;
    }
  }
  // Decode steps: one per generated token after the first (which the prefill step produces).
  const auto decode_steps = static_cast<int64_t>(ref.generated.size()) - 1;
  EXPECT_EQ(models::graph_replays(*model), decode_steps - 1);
  // The graph is kernels only: no memset between two kernels ends their programmatic launch (the
  // attention output's zero fill did, in every layer).
  const models::StepGraphNodes nodes = models::step_graph_nodes(*model);
  EXPECT_GT(nodes.kernels, 0);
  EXPECT_EQ(nodes.memsets, 0);
  EXPECT_EQ(nodes.others, 0);
}

// o's weights brought into L2 on a side stream (ops/cuda/l2_prefetch.h) in every decode step
// leave its decode steps replayed as one graph of kernels (the side branch joins before the
// capture ends), in float32 and bf16. (The float32 tokens and routes against the reference:
// DecodeStepsReplayAsOneGraphWithCaptureOn.)
TEST(GpuGraphs, OProjectionPrefetchedBesideTheChainKeepsAGraphOfKernels) {
  const Reference ref = load_reference("qwen3_moe", 0);
  auto gpu = backend::Context::cuda(0);
  const std::vector<int64_t> prompt64 = prompt_ids(ref);
  const std::vector<int32_t> prompt(prompt64.begin(), prompt64.end());
  engine::GenerateOptions options;
  options.max_new_tokens = static_cast<int64_t>(ref.generated.size());
  for (const DType weights : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(weights));
    auto model = models::place_on_device(*gpu, models::load_model(family_dir("qwen3_moe")), weights);
    engine::generate(*model, *gpu, prompt, options);
    EXPECT_GT(models::graph_replays(*model), 0);
    const models::StepGraphNodes nodes = models::step_graph_nodes(*model);
    EXPECT_GT(nodes.kernels, 0);
    EXPECT_EQ(nodes.memsets + nodes.others, 0);
  }
}

// The device KV pools take the weights' precision: a bf16 placement's cache holds half the bytes
// of a float32 one of the same size (its keys and values are bf16).
TEST(GpuCache, Bf16WeightsCacheBf16KeysAndValues) {
  auto gpu = backend::Context::cuda(0);
  int64_t bytes[2] = {0, 0};
  for (const DType weights : {DType::F32, DType::BF16}) {
    auto model = models::place_on_device(*gpu, models::load_model(family_dir("qwen3_moe")), weights);
    auto cache = model->make_cache(2, 64);
    const auto* kv = dynamic_cast<const models::KvCache*>(cache.get());
    ASSERT_NE(kv, nullptr);
    bytes[weights == DType::BF16] = kv->pool_bytes();
    EXPECT_EQ(kv->bytes_per_token() * 64 * 2, kv->pool_bytes()) << dtype_name(weights);
  }
  EXPECT_GT(bytes[0], 0);
  EXPECT_EQ(bytes[1] * 2, bytes[0]);
}

// A synthetic model small enough for the tests that still takes the decode kernels a real one
// does: the tensor-core attention (head dim 64, bf16 pool) and the wide-load projections.
models::SyntheticShape small_synthetic_shape() {
  models::SyntheticShape shape;
  shape.layers = 2;
  shape.hidden = 256;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 64;
  shape.experts = 16;
  shape.top_k = 4;
  shape.expert_width = 128;
  shape.vocab = 1000;
  return shape;
}

// A model of random weights made on the GPU (the benchmark's; no host layers behind it), at a
// small shape: decode steps with capture switched on, off and on again give bit-identical logits
// (capture changes no result), the captured rows are valid expert ids, and steps of each kind
// replay as graphs. (The benchmark crashed here once: the EPLB hook looked for a host layer.)
TEST(GpuSynthetic, CaptureOnAndOffGiveTheSameLogits) {
  auto gpu = backend::Context::cuda(0);
  models::SyntheticShape shape = small_synthetic_shape();
  auto model = models::synthetic_on_device(*gpu, shape);
  constexpr int64_t kBatch = 3, kContext = 40;
  auto cache = model->make_cache(kBatch, kContext + 1);
  models::ForwardBatch step;
  for (int64_t b = 0; b < kBatch; ++b) {
    step.token_ids.push_back(static_cast<int32_t>(10 + b));
    step.positions.push_back(static_cast<int32_t>(kContext - 1));
    step.seqs.push_back(static_cast<int32_t>(b));
  }
  moe::RoutingCapturer capturer(kBatch, shape.layers, shape.top_k, shape.experts);
  const auto run = [&](bool capture) {
    models::set_capture_routing(*model, capture);
    step.capture = capture ? &capturer : nullptr;
    Tensor logits = Tensor::empty(DType::F32, {kBatch, shape.vocab});
    for (int64_t b = 0; b < kBatch; ++b) cache->set_length(b, kContext - 1);
    if (capture) capturer.begin_step(kBatch);
    model->forward_into(*gpu, step, *cache, logits);
    if (capture) capturer.end_step();
    return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
  };
  const std::vector<float> on = run(true);
  for (int64_t t = 0; t < kBatch; ++t) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      for (int64_t c = 0; c < shape.top_k; ++c) {
        EXPECT_GE(capturer.id(t, l, c), 0);
        EXPECT_LT(capturer.id(t, l, c), shape.experts);
      }
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(false), on) << "capture off, step " << i;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(true), on) << "capture on, step " << i;
  EXPECT_GE(models::graph_replays(*model), 2);
}

// Short kernels release their successors early, and those load what no kernel of the step writes
// before they wait (backend/cuda/launch.cuh): weights, and the KV rows of past steps. A step's
// own rows must still be read after the kernel that writes them: a prefill step of two sequences
// (tokens of one sequence attend to rows the same step writes) then decode steps, in bf16 and
// FP8, give finite logits with the same bits in two runs (a read that raced its writer would
// vary from run to run).
TEST(GpuGraphs, KernelsReleasedEarlyGiveTheSameBits) {
  auto gpu = backend::Context::cuda(0);
  models::SyntheticShape shape = small_synthetic_shape();
  constexpr int32_t kPrompt[2] = {90, 37};  // two chunks of 64 positions for the longer one
  constexpr int kDecodeSteps = 3;
  const auto run = [&] {
    auto model = models::synthetic_on_device(*gpu, shape, 7, false);
    auto cache = model->make_cache(2, kPrompt[0] + kDecodeSteps + 1);
    std::vector<float> all;
    const auto step = [&](const models::ForwardBatch& batch) {
      Tensor logits = Tensor::empty(DType::F32, {batch.size(), shape.vocab});
      model->forward_into(*gpu, batch, *cache, logits);
      all.insert(all.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    };
    models::ForwardBatch prefill;
    for (int32_t s = 0; s < 2; ++s) {
      cache->set_length(s, 0);
      for (int32_t p = 0; p < kPrompt[s]; ++p) {
        prefill.token_ids.push_back((7 * p + 3 * s) % 1000);
        prefill.positions.push_back(p);
        prefill.seqs.push_back(s);
      }
    }
    step(prefill);
    for (int i = 0; i < kDecodeSteps; ++i) {
      models::ForwardBatch decode;
      for (int32_t s = 0; s < 2; ++s) {
        cache->set_length(s, kPrompt[s] + i);
        decode.token_ids.push_back((11 * i + s) % 1000);
        decode.positions.push_back(kPrompt[s] + i);
        decode.seqs.push_back(s);
      }
      step(decode);
    }
    return all;
  };
  for (const bool fp8 : {false, true}) {
    shape.fp8 = fp8;
    const std::vector<float> first = run(), second = run();
    ASSERT_EQ(second.size(), first.size());
    EXPECT_TRUE(second == first) << (fp8 ? "FP8" : "bf16") << " weights";
    EXPECT_TRUE(std::all_of(first.begin(), first.end(), [](float v) { return std::isfinite(v); }));
  }
}

// Two engines on one device model, stepped in turn: each has its own KV cache, so a decode graph
// recorded on one cache's pools must not be replayed on the other's (it was: the second engine's
// steps read and wrote the first one's pools). Each must still produce its own reference.
TEST(GpuGraphs, TwoEnginesSteppedInTurnEachKeepTheirOwnCache) {
  const Reference a = load_reference("qwen3_moe", 0), b = load_reference("qwen3_moe", 1);
  const std::size_t gen = std::min(a.generated.size(), b.generated.size());
  auto gpu = backend::Context::cuda(0);
  auto model = models::place_on_device(*gpu, models::load_model(family_dir("qwen3_moe")), DType::F32);
  engine::Engine first(*model, *gpu, {}), second(*model, *gpu, {});
  std::map<const engine::Engine*, std::vector<int32_t>> tokens;
  for (auto [e, ref] : {std::pair{&first, &a}, std::pair{&second, &b}}) {
    const std::vector<int64_t> prompt = prompt_ids(*ref);
    e->submit(greedy_request(std::vector<int32_t>(prompt.begin(), prompt.end()), static_cast<int64_t>(gen)));
  }
  while (first.has_work() || second.has_work()) {
    for (engine::Engine* e : {&first, &second}) {
      if (!e->has_work()) continue;
      for (const auto& out : e->step()) {
        for (const auto& s : out.samples) tokens[e].insert(tokens[e].end(), s.token_ids.begin(), s.token_ids.end());
      }
    }
  }
  EXPECT_EQ(std::vector<int64_t>(tokens[&first].begin(), tokens[&first].end()),
            std::vector<int64_t>(a.generated.begin(), a.generated.begin() + static_cast<std::ptrdiff_t>(gen)));
  EXPECT_EQ(std::vector<int64_t>(tokens[&second].begin(), tokens[&second].end()),
            std::vector<int64_t>(b.generated.begin(), b.generated.begin() + static_cast<std::ptrdiff_t>(gen)));
  EXPECT_GT(models::graph_replays(*model), 0);
}

// The engine's serving-exactness check on the GPU with the batch-invariant kernels: 32 requests,
// each alone and then served together (batched, small prefill chunks, without prefix caching,
// under preemption), get the same tokens and routed experts bit for bit. Float32 weights (their
// GEMMs leave cuBLASLt for the row kernel) and bfloat16 ones; GPT-OSS adds sinks and sliding
// windows; Kimi Linear and Kimi K3 keep recurrent states in device memory, zeroed for each
// request a slot takes and after a preemption.
TEST(GpuEngine, EachRequestIsBitIdenticalAloneAndServedWithBatchInvariance) {
  for (const std::string family : {"qwen3_moe", "gpt_oss", "qwen3_moe_fp8", "kimi_linear", "kimi_k3"}) {
    for (const DType weights : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(family + " " + std::string(dtype_name(weights)));
      auto gpu = backend::Context::cuda(0);
      gpu->set_batch_invariant(true);
      auto model = models::place_on_device(*gpu, models::load_model(family_dir(family)), weights);
      const auto prompts = engine_prompts(32, model->info().vocab_size, 7);
      std::vector<int64_t> max_new;
      for (std::size_t i = 0; i < prompts.size(); ++i) max_new.push_back(1 + static_cast<int64_t>(i % 8));
      expect_served_as_alone(*model, *gpu, prompts, max_new, {}, serving_cases());
    }
  }
}

// The FP8 fixture re-expressed in 16x16 blocks, each published 128x128 scale repeated over the
// 16x16 blocks it covers: the same dequantized weights, so the same references. At 16-row blocks
// q (64 rows), k and v (32 each) start and end on block rows, so the device stacks them into one
// FP8 projection with one grid of scales (models/cuda/device_layers.cpp, as Qwen3-30B-A3B-FP8's
// 4096 + 512 + 512 rows in blocks of 128 are); at 128 they stay three projections.
TEST(GpuQuantized, Fp8QkvStackedIntoOneProjectionMatchesTheReference) {
  TempDir tmp;
  const std::string source = family_dir("qwen3_moe_fp8");
  std::ifstream config_file(source + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  nlohmann::json quantization = config.at("quantization_config");
  const int64_t coarse = quantization.at("weight_block_size").at(0).get<int64_t>(), fine = 16;
  ASSERT_EQ(quantization.at("weight_block_size").at(1).get<int64_t>(), coarse);
  quantization["weight_block_size"] = {fine, fine};
  const std::string dir = copy_model_with_config("qwen3_moe_fp8", tmp, "fine_blocks", "quantization_config",
                                                 quantization.dump());
  const auto file = SafetensorsFile::open(source + "/model.safetensors");
  std::vector<NamedTensor> tensors;
  int64_t refined = 0;
  const std::string suffix = ".weight_scale_inv";
  for (const auto& [name, entry] : file->entries()) {
    Tensor t = file->view(name);
    if (name.ends_with(suffix)) {
      const Tensor w = file->view(name.substr(0, name.size() - suffix.size()) + ".weight");
      const int64_t rows = (w.dim(0) + fine - 1) / fine, cols = (w.dim(1) + fine - 1) / fine;
      Tensor finer = Tensor::empty(t.dtype(), {rows, cols});
      const std::size_t size = dtype_size(t.dtype());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          std::memcpy(static_cast<char*>(finer.raw_data()) + (r * cols + c) * size,
                      static_cast<const char*>(t.raw_data()) + ((r * fine / coarse) * t.dim(1) + c * fine / coarse) * size,
                      size);
        }
      }
      t = finer;
      ++refined;
    }
    tensors.push_back({name, t});
  }
  ASSERT_GT(refined, 0);
  write_safetensors(dir + "/model.safetensors", tensors);
  const Reference ref = load_reference("qwen3_moe_fp8", 0);
  const std::string dump = tmp.path("dump.safetensors");
  const CommandResult run = run_r3("forward -q --device cuda --dtype float32 --model " + dir + " --ids " +
                                   join(forward_ids(ref)) + " --dump " + dump);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_forward_dump_matches(ref, dump);
}

TEST(GpuRefusals, WhatHasNoCudaKernelsIsRefusedByName) {
  const std::string ids = " --ids 1,2,3";
  EXPECT_TRUE(refused_with(run_r3("forward -q --device cuda --model " + family_dir("deepseek_v4") + ids),
                           "has no CUDA kernels yet (DeepSeek-V4's compressed attention"));
}

}  // namespace
}  // namespace r3::test
