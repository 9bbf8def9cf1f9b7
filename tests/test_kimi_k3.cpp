// Kimi K3 (issue 13) beyond the shared suites (reference parity, serving, replay, MoE paths,
// zero allocation): the first decoder layer's pieces (KDA with the bounded forget gate and
// full-rank output gate, the attention-residual mix, the SiTU MLP) reproduce transformers'
// float64 hidden_states[1] with the delta rule chunked and recurrent; a sequence spanning several
// KDA chunks decodes exactly as its full forward runs; what K3 cannot do is refused with its
// reason; malformed configs are refused naming the field or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/step_runner.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/kda_attention.h"
#include "models/kimi_k3/attention_residual.h"
#include "models/kimi_k3/situ_mlp.h"
#include "models/registry.h"
#include "ops/elementwise.h"
#include "ops/rms_norm.h"
#include "test_support.h"

namespace r3::test {
namespace {

constexpr int64_t kK3Hidden = 64;
constexpr float kK3Eps = 1e-5f;  // the fixture's rms_norm_eps

models::KdaSpec k3_kda_spec() {
  models::KdaSpec spec{kK3Hidden, 4, 16, 4, kK3Eps, -5.0f};
  spec.full_rank_output_gate = true;
  return spec;
}

TEST(KimiK3Layers, FirstLayerReproducesTransformersHiddenStates) {
  const Checkpoint c = Checkpoint::open(family_dir("kimi_k3"));
  const models::KdaSpec spec = k3_kda_spec();
  models::ParameterTable table;
  models::ParameterLoader params(c, table);
  const models::KdaAttention kda(spec, models::KdaAttention::load(params, "model.layers.0.self_attn.", spec, 0));
  const std::string p = "model.layers.0.";
  const models::SituMlp dense(c.load_weight(p + "mlp.gate_proj.weight", {128, kK3Hidden}),
                              c.load_weight(p + "mlp.up_proj.weight", {128, kK3Hidden}),
                              c.load_weight(p + "mlp.down_proj.weight", {kK3Hidden, 128}),
                              moe::ExpertActivation::situ(4.0f, 25.0f));
  const models::AttentionResidual post_mix(c.load_f32(p + "mlp_res_proj.weight", {1, kK3Hidden}),
                                           c.load_f32(p + "mlp_res_norm.weight", {kK3Hidden}), kK3Eps);
  const Tensor input_norm = c.load_f32(p + "input_layernorm.weight", {kK3Hidden});
  const Tensor post_norm = c.load_f32(p + "post_attention_layernorm.weight", {kK3Hidden});
  backend::Context ctx(2);
  for (const int index : {0, 1}) {
    auto file = SafetensorsFile::open(family_dir("kimi_k3") + "/reference_" + std::to_string(index) + ".safetensors");
    const std::vector<double> hidden = read_as_f64(*file, "hidden_states");  // [layers + 1, T, 64]
    const auto tokens = static_cast<int64_t>(hidden.size()) / (5 * kK3Hidden);
    for (const bool chunked : {true, false}) {
      // Layer 0 starts a block: its input is the embedding h0, which becomes the first snapshot
      // and leaves the running sum; the MLP reads the mix of [h0] and the attention output a.
      Tensor h0 = Tensor::empty(DType::F32, {tokens, kK3Hidden});
      for (int64_t i = 0; i < tokens * kK3Hidden; ++i) h0.data<float>()[i] = static_cast<float>(hidden[i]);
      Tensor normed = Tensor::empty(DType::F32, {tokens, kK3Hidden}), a = Tensor::empty(DType::F32, {tokens, kK3Hidden});
      std::vector<float> conv(static_cast<std::size_t>(kda.conv_state_floats()), 0.0f),
          recurrent(static_cast<std::size_t>(kda.recurrent_state_floats()), 0.0f);
      ops::rms_norm(ctx, h0, &input_norm, kK3Eps, normed);
      kda.forward_sequence(ctx, normed, {conv.data(), recurrent.data()}, a, chunked);
      Tensor snapshots = h0.reshaped({1, tokens, kK3Hidden});
      Tensor mixed = Tensor::empty(DType::F32, {tokens, kK3Hidden}), m = Tensor::empty(DType::F32, {tokens, kK3Hidden});
      post_mix.mix(ctx, snapshots, 1, a, mixed);
      ops::rms_norm(ctx, mixed, &post_norm, kK3Eps, normed);
      dense.forward(ctx, normed, m);
      ops::add_rows(ctx, m, nullptr, a);
      double err = 0, scale = 0;
      for (int64_t i = 0; i < tokens * kK3Hidden; ++i) {
        const double want = hidden[tokens * kK3Hidden + i];  // hidden_states[1]
        err = std::max(err, std::abs(a.data<float>()[i] - want));
        scale = std::max(scale, std::abs(want));
      }
      EXPECT_LT(err / scale, 1e-5) << "sequence " << index << (chunked ? ", chunked" : ", recurrent");
    }
  }
}

// 150 positions (three chunks of 64, as the fixture's long_sequence_check): the KDA layer's
// chunked form agrees with the recurrent one over them, and the whole model decoding 50 tokens
// after a 100-token prefill gives bit for bit the logits and routing of one forward over all 150.
TEST(KimiK3Layers, SequenceOfSeveralChunksDecodesAsItsFullForward) {
  constexpr int64_t kTokens = 150, kPrefill = 100;
  std::mt19937 rng(3301);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < kTokens; ++i) ids.push_back(static_cast<int32_t>(3 + rng() % 317));
  backend::Context ctx(2);

  const Checkpoint c = Checkpoint::open(family_dir("kimi_k3"));
  const models::KdaSpec spec = k3_kda_spec();
  models::ParameterTable table;
  models::ParameterLoader params(c, table);
  const models::KdaAttention kda(spec, models::KdaAttention::load(params, "model.layers.2.self_attn.", spec, 2));
  const Tensor x = random_normal({kTokens, kK3Hidden}, 7);
  std::vector<std::vector<float>> outs;
  for (const bool chunked : {true, false}) {
    std::vector<float> conv(static_cast<std::size_t>(kda.conv_state_floats()), 0.0f),
        recurrent(static_cast<std::size_t>(kda.recurrent_state_floats()), 0.0f);
    Tensor out = Tensor::empty(DType::F32, {kTokens, kK3Hidden});
    kda.forward_sequence(ctx, x, {conv.data(), recurrent.data()}, out, chunked);
    outs.push_back(float_values(out));
  }
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < outs[0].size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(outs[0][i] - outs[1][i])));
    scale = std::max(scale, static_cast<double>(std::abs(outs[1][i])));
  }
  EXPECT_GT(scale, 0);
  EXPECT_LT(err / scale, 1e-5);

  for (const std::string path : {"modular", "monolithic", "mega"}) {
    models::LoadOptions options;
    options.moe_path = moe::parse_moe_path(path);
    auto model = models::load_model(family_dir("kimi_k3"), options);
    const int64_t layers = static_cast<int64_t>(model->info().moe_layers.size()), k = model->info().top_k;
    auto full_cache = model->make_cache(1, kTokens);
    engine::StepRunner full_runner(*model, ctx, *full_cache, kTokens);
    engine::RoutedExperts full(layers, k);
    const Tensor full_logits = full_runner.run({{0, ids, &full, {}}}, 0, true);

    auto cache = model->make_cache(1, kTokens);
    engine::StepRunner runner(*model, ctx, *cache, kTokens);
    engine::RoutedExperts stepped(layers, k);
    std::vector<float> stepped_logits = float_values(
        runner.run({{0, std::vector<int32_t>(ids.begin(), ids.begin() + kPrefill), &stepped, {}}}, 0, true));
    for (int64_t t = kPrefill; t < kTokens; ++t) {
      const std::vector<float> row = float_values(runner.run({{0, {ids[static_cast<std::size_t>(t)]}, &stepped, {}}}, 0, true));
      stepped_logits.insert(stepped_logits.end(), row.begin(), row.end());
    }
    EXPECT_EQ(stepped_logits, float_values(full_logits)) << path;
    EXPECT_EQ(stepped.flat(), full.flat()) << path;
  }
}

// Prefix caching is off with its reason (the KDA layers' recurrent state).
TEST(KimiK3Serving, PrefixCachingIsOffWithItsReason) {
  auto model = models::load_model(family_dir("kimi_k3"));
  backend::Context ctx(2);
  engine::EngineOptions options;
  options.prefix_caching = true;
  const engine::Engine e(*model, ctx, options);
  EXPECT_NE(e.prefix_caching_off_reason().find("recurrent state per sequence"), std::string::npos)
      << e.prefix_caching_off_reason();
}

// Configs that do not describe the checkpoint, or switch off what K3 is built with, are refused
// with one line naming the field (or, for a wrong size, the first tensor it does not fit).
TEST(KimiK3Config, MalformedConfigsAreRefusedByName) {
  TempDir tmp;
  struct ConfigCase { const char* key; const char* value; const char* message; };
  int n = 0;
  for (const ConfigCase c :
       {ConfigCase{"mla_use_output_gate", "false", "'mla_use_output_gate' is false"},
        ConfigCase{"latent_moe_use_norm", "false", "'latent_moe_use_norm' is false"},
        ConfigCase{"hidden_act", R"("silu")", "'hidden_act' is 'silu'"},
        ConfigCase{"topk_method", R"("greedy")", "'topk_method' is 'greedy'"},
        ConfigCase{"forget_gate_lower_bound", "2.0", "'forget_gate_lower_bound' must be negative"},
        ConfigCase{"attn_res_block_size", "0", "attn_res_block_size"},
        ConfigCase{"attn_res_block_size", "9", "attn_res_block_size"},
        ConfigCase{"activation_situ_beta", "0", "'activation_situ_beta' must be positive"},
        ConfigCase{"routed_expert_hidden_size", "48", "model.layers.1.block_sparse_moe.experts.0.w1.weight"},
        ConfigCase{"use_full_rank_output_gate", "false", "model.layers.0.self_attn.g_a_proj.weight"},
        ConfigCase{"num_shared_experts", "0", "'num_shared_experts' must be positive"},
        ConfigCase{"layer_types", R"(["linear_attention","full_attention","linear_attention","sliding_attention"])",
                   "layer type 'sliding_attention'"}}) {
    const std::string dir = copy_model_with_config("kimi_k3", tmp, "case" + std::to_string(n++), c.key, c.value);
    const std::string error = error_of([&] { models::load_model(dir); });
    EXPECT_NE(error.find(c.message), std::string::npos) << c.key << " = " << c.value << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

// A checkpoint without one of K3's own tensors, or with one of the wrong shape, is refused naming it.
TEST(KimiK3Config, MissingOrMisshapenTensorsAreRefusedByName) {
  TempDir tmp;
  auto file = SafetensorsFile::open(family_dir("kimi_k3") + "/model.safetensors");
  struct TensorCase { const char* name; bool drop; const char* message; };
  int n = 0;
  for (const TensorCase c : {TensorCase{"model.output_attn_res_proj.weight", true, "model.output_attn_res_proj.weight"},
                             TensorCase{"model.layers.3.mlp_res_norm.weight", true, "model.layers.3.mlp_res_norm.weight"},
                             TensorCase{"model.layers.1.self_attn.g_proj.weight", true,
                                        "model.layers.1.self_attn.g_proj.weight"},
                             TensorCase{"model.layers.2.block_sparse_moe.routed_expert_norm.weight", false,
                                        "model.layers.2.block_sparse_moe.routed_expert_norm.weight"}}) {
    const std::string dir = tmp.path("case" + std::to_string(n++));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(family_dir("kimi_k3") + "/config.json", dir + "/config.json");
    std::vector<NamedTensor> tensors;
    for (const auto& [name, entry] : file->entries()) {
      if (name != c.name) {
        tensors.push_back({name, file->view(name)});
      } else if (!c.drop) {
        tensors.push_back({name, Tensor::empty(DType::F32, {entry.shape[0] + 1})});  // one value too many
      }
    }
    write_safetensors(dir + "/model.safetensors", tensors);
    const std::string error = error_of([&] { models::load_model(dir); });
    EXPECT_NE(error.find(c.message), std::string::npos) << c.name << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace r3::test
