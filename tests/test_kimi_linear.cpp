// Kimi Linear (issue 13), layer by layer: the fixture's first
// decoder layer (Kimi Delta Attention, then a dense SwiGLU MLP) reproduces transformers 5.17's
// float64 hidden_states[1] from hidden_states[0], on both reference sequences, whether the
// sequence runs at once (with the chunked delta rule and with the recurrent one), token by token
// (through the kept state), or as a prefill continued token by token.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <vector>

#include "engine/engine.h"
#include "io/checkpoint.h"
#include "models/registry.h"
#include "models/decoder_model.h"
#include "models/kda_attention.h"
#include "models/kv_cache.h"
#include "models/swiglu_mlp.h"
#include "ops/elementwise.h"
#include "ops/rms_norm.h"
#include "test_support.h"

namespace r3::test {
namespace {

TEST(KimiLinearLayers, FirstLayerReproducesTransformersHiddenStates) {
  const Checkpoint c = Checkpoint::open(family_dir("kimi_linear"));
  const models::KdaSpec spec{64, 4, 16, 4, 1e-6f, std::nullopt};
  models::ParameterTable table;
  models::ParameterLoader params(c, table);
  const models::KdaAttention kda(spec, models::KdaAttention::load(params, "model.layers.0.self_attn.", spec, 0));
  const std::string mlp = "model.layers.0.block_sparse_moe.";
  const models::SwigluMlp dense(c.load_weight(mlp + "gate_proj.weight", {128, 64}),
                                c.load_weight(mlp + "up_proj.weight", {128, 64}),
                                c.load_weight(mlp + "down_proj.weight", {64, 128}));
  const Tensor input_norm = c.load_f32("model.layers.0.input_layernorm.weight", {64});
  const Tensor post_norm = c.load_f32("model.layers.0.post_attention_layernorm.weight", {64});
  backend::Context ctx(2);
  for (const int index : {0, 1}) {
    auto file = SafetensorsFile::open(family_dir("kimi_linear") + "/reference_" + std::to_string(index) + ".safetensors");
    const std::vector<double> hidden = read_as_f64(*file, "hidden_states");  // [layers + 1, T, 64]
    const auto tokens = static_cast<int64_t>(hidden.size()) / (5 * 64);
    // One decoder layer over rows [first, first + n) of the sequence, continuing `state`.
    auto layer = [&](int64_t first, int64_t n, models::KdaState state, std::vector<float>& out, bool chunked) {
      Tensor x = Tensor::empty(DType::F32, {n, 64});
      for (int64_t i = 0; i < n * 64; ++i) x.data<float>()[i] = static_cast<float>(hidden[first * 64 + i]);
      Tensor normed = Tensor::empty(DType::F32, {n, 64}), branch = Tensor::empty(DType::F32, {n, 64});
      ops::rms_norm(ctx, x, &input_norm, 1e-6f, normed);
      kda.forward_sequence(ctx, normed, state, branch, chunked);
      ops::add_rows(ctx, branch, nullptr, x);
      ops::rms_norm(ctx, x, &post_norm, 1e-6f, normed);
      dense.forward(ctx, normed, branch);
      ops::add_rows(ctx, branch, nullptr, x);
      std::copy(x.data<float>(), x.data<float>() + n * 64, out.begin() + first * 64);
    };
    // At once, token by token, 7 then one by one; each prefill chunked or recurrent.
    for (const int64_t prefill : {tokens, int64_t{0}, int64_t{7}})
    for (const bool chunked : {true, false}) {
      std::vector<float> conv(static_cast<std::size_t>(kda.conv_state_floats()), 0.0f),
          recurrent(static_cast<std::size_t>(kda.recurrent_state_floats()), 0.0f), got(static_cast<std::size_t>(tokens * 64));
      const models::KdaState state{conv.data(), recurrent.data()};
      if (prefill > 0) layer(0, prefill, state, got, chunked);
      for (int64_t t = prefill; t < tokens; ++t) layer(t, 1, state, got, chunked);
      double err = 0, scale = 0;
      for (int64_t i = 0; i < tokens * 64; ++i) {
        const double want = hidden[tokens * 64 + i];  // hidden_states[1]
        err = std::max(err, std::abs(got[i] - want));
        scale = std::max(scale, std::abs(want));
      }
      EXPECT_LT(err / scale, 1e-5) << "sequence " << index << ", prefill of " << prefill << " tokens"
                                   << (chunked ? ", chunked" : ", recurrent");
    }
  }
}

// The layer inside a step: a KV cache holds each sequence's state (a recurrent-state layer beside
// an ordinary one), a batch's sequences (and a padding row) run from their own states and give
// what each gives alone, decode continues them in any order, and the cache refuses what a
// recurrent state cannot do: rows that skip positions, shortening, prefix sharing.
TEST(KimiLinearLayers, KdaLayerRunsEachSequenceOfABatchFromItsCachedState) {
  const Checkpoint c = Checkpoint::open(family_dir("kimi_linear"));
  const models::KdaSpec spec{64, 4, 16, 4, 1e-6f, std::nullopt};
  models::ParameterTable table;
  models::ParameterLoader params(c, table);
  const models::KdaAttention kda(spec, models::KdaAttention::load(params, "model.layers.0.self_attn.", spec, 0));
  // The table names the memory the layer reads: each convolution's taps are rows of the stacked ones.
  EXPECT_EQ(table.at("model.layers.0.self_attn.k_conv1d.weight").tensor.data<float>(),
            kda.weights().conv.data<float>() + 64 * 4);
  backend::Context ctx(2);
  models::KvCache cache({kda.cache_spec(), models::CacheSpec::full_kv(8)}, 2, 32);
  EXPECT_NE(cache.prefix_sharing_unsupported().find("recurrent state"), std::string::npos);
  auto file = SafetensorsFile::open(family_dir("kimi_linear") + "/reference_0.safetensors");
  const std::vector<double> hidden = read_as_f64(*file, "hidden_states");
  auto rows = [&](int64_t first, int64_t n) {  // embedding rows as the layer's input
    Tensor x = Tensor::empty(DType::F32, {n, 64});
    for (int64_t i = 0; i < n * 64; ++i) x.data<float>()[i] = static_cast<float>(hidden[first * 64 + i]);
    return x;
  };
  // Alone: sequence A = rows 0..10, sequence B = rows 4..10, each from a zero state.
  std::vector<float> a_conv(kda.conv_state_floats()), a_rec(kda.recurrent_state_floats()),
      b_conv(kda.conv_state_floats()), b_rec(kda.recurrent_state_floats());
  Tensor want_a = Tensor::empty(DType::F32, {11, 64}), want_b = Tensor::empty(DType::F32, {7, 64});
  {
    Tensor a0 = want_a.rows(0, 10), a1 = want_a.rows(10, 11), b0 = want_b.rows(0, 6), b1 = want_b.rows(6, 7);
    kda.forward_sequence(ctx, rows(0, 10), {a_conv.data(), a_rec.data()}, a0, false);
    kda.forward_sequence(ctx, rows(10, 1), {a_conv.data(), a_rec.data()}, a1, false);
    kda.forward_sequence(ctx, rows(4, 6), {b_conv.data(), b_rec.data()}, b0, false);
    kda.forward_sequence(ctx, rows(10, 1), {b_conv.data(), b_rec.data()}, b1, false);
  }
  auto run = [&](const std::vector<int32_t>& seqs, const std::vector<int32_t>& positions, const Tensor& x) {
    models::ForwardBatch batch;
    batch.seqs = seqs;
    batch.positions = positions;
    batch.token_ids.assign(seqs.size(), 0);
    Tensor out = Tensor::empty(DType::F32, {x.dim(0), 64});
    models::check_runs_continue_states(batch, cache, ctx.workspace());  // as the decoders do before a step
    kda.forward(ctx, x, batch.view(), cache, 0, out);
    for (std::size_t t = 0; t < seqs.size(); ++t) {
      if (seqs[t] != models::ForwardBatch::kPadding) cache.set_length(seqs[t], positions[t] + 1);
    }
    return out;
  };
  auto row_of = [](const Tensor& t, int64_t r) { return std::vector<float>(t.data<float>() + r * 64, t.data<float>() + (r + 1) * 64); };
  // Step 1: A's 10 prompt rows, a padding row, B's 6. Step 2: B's and A's next rows, B first.
  Tensor x1 = Tensor::empty(DType::F32, {17, 64});
  std::copy_n(rows(0, 10).data<float>(), 10 * 64, x1.data<float>());
  std::copy_n(rows(4, 6).data<float>(), 6 * 64, x1.data<float>() + 11 * 64);
  std::vector<int32_t> seqs1(17, 0), positions1(17, 0);
  for (int t = 0; t < 10; ++t) positions1[t] = t;
  seqs1[10] = models::ForwardBatch::kPadding;
  for (int t = 0; t < 6; ++t) {
    seqs1[11 + t] = 1;
    positions1[11 + t] = t;
  }
  const Tensor out1 = run(seqs1, positions1, x1);
  for (int t = 0; t < 10; ++t) EXPECT_EQ(row_of(out1, t), row_of(want_a, t)) << "A row " << t;
  EXPECT_EQ(row_of(out1, 10), std::vector<float>(64, 0.0f)) << "padding row";
  for (int t = 0; t < 6; ++t) EXPECT_EQ(row_of(out1, 11 + t), row_of(want_b, t)) << "B row " << t;
  Tensor x2 = Tensor::empty(DType::F32, {2, 64});
  std::copy_n(rows(10, 1).data<float>(), 64, x2.data<float>());
  std::copy_n(rows(10, 1).data<float>(), 64, x2.data<float>() + 64);
  const Tensor out2 = run({1, 0}, {6, 10}, x2);
  EXPECT_EQ(row_of(out2, 0), row_of(want_b, 6));
  EXPECT_EQ(row_of(out2, 1), row_of(want_a, 10));
  // Rows that do not continue the cached positions, and shortening, are refused.
  EXPECT_NE(error_of([&] { run({0}, {5}, rows(5, 1)); }).find("state holds 11 positions"), std::string::npos);
  EXPECT_NE(error_of([&] { cache.set_length(0, 3); }).find("recurrent state"), std::string::npos);
  // Length 0 starts the sequence over from a zero state.
  cache.set_length(0, 0);
  const Tensor again = run(std::vector<int32_t>(10, 0), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, rows(0, 10));
  for (int t = 0; t < 10; ++t) EXPECT_EQ(row_of(again, t), row_of(want_a, t)) << "A again, row " << t;
  // Placed (here on the CPU) with q, k and v stacked into one projection, as on a GPU: the same bits.
  const std::unique_ptr<models::AttentionLayer> placed = kda.placed(ctx, DType::F32);
  ASSERT_TRUE(dynamic_cast<const models::KdaAttention&>(*placed).weights().qkv.defined());
  models::KvCache placed_cache({kda.cache_spec(), models::CacheSpec::full_kv(8)}, 2, 32);
  models::ForwardBatch batch;
  batch.seqs = seqs1;
  batch.positions = positions1;
  batch.token_ids.assign(seqs1.size(), 0);
  Tensor placed_out = Tensor::empty(DType::F32, {17, 64});
  placed->forward(ctx, x1, batch.view(), placed_cache, 0, placed_out);
  for (int t = 0; t < 17; ++t) EXPECT_EQ(row_of(placed_out, t), row_of(out1, t)) << "placed, row " << t;
}

// Prefix caching is turned off for Kimi Linear at start-up, with its reason: a cached prefix's
// blocks would not hold the recurrent state after it.
TEST(KimiLinearServing, PrefixCachingIsOffWithItsReason) {
  auto model = models::load_model(family_dir("kimi_linear"));
  backend::Context ctx(2);
  engine::EngineOptions options;
  options.prefix_caching = true;
  const engine::Engine e(*model, ctx, options);
  EXPECT_NE(e.prefix_caching_off_reason().find("recurrent state per sequence"), std::string::npos)
      << e.prefix_caching_off_reason();
}

// Kimi Linear configs that cannot describe the checkpoint are refused with a message naming the
// field: an unknown layer type, too few layer types, an unknown MLP type, and (without
// layer_types) a 1-indexed layer outside the model.
TEST(KimiLinearConfig, MalformedLayerKindsAreRefusedByName) {
  TempDir tmp;
  struct ConfigCase { const char* key; const char* value; const char* message; };
  int n = 0;
  for (const ConfigCase c : {ConfigCase{"layer_types", R"(["linear_attention","linear_attention","sliding_attention","linear_attention"])",
                            "layer type 'sliding_attention'"},
                       ConfigCase{"layer_types", R"(["linear_attention","full_attention"])", "2 layer types for 4 layers"},
                       ConfigCase{"mlp_layer_types", R"(["dense","sparse","moe","sparse"])", "mlp layer type 'moe'"},
                       ConfigCase{"linear_attn_config", R"({"kda_layers":[1,2,5],"full_attn_layers":[3]})",
                            "kda_layers names layer 5 of 4"}}) {
    const std::string dir = copy_model_with_config("kimi_linear", tmp, "case" + std::to_string(n++), c.key, c.value);
    if (std::string(c.key) == "linear_attn_config") {  // only read when layer_types is absent
      nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
      config.erase("layer_types");
      std::ofstream(dir + "/config.json") << config.dump(2);
    }
    const std::string error = error_of([&] { models::load_model(dir); });
    EXPECT_NE(error.find(c.message), std::string::npos) << c.key << ": " << error;
  }
}

}  // namespace
}  // namespace r3::test
