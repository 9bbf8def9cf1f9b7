// Kimi Linear (issue 13), layer by layer while the family is being built: the fixture's first
// decoder layer (Kimi Delta Attention, then a dense SwiGLU MLP) reproduces transformers 5.17's
// float64 hidden_states[1] from hidden_states[0], on both reference sequences, whether the
// sequence runs at once (the chunked delta rule), token by token (the recurrent one, through the
// kept state), or as a prefill continued token by token.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "io/checkpoint.h"
#include "models/kda_attention.h"
#include "models/swiglu_mlp.h"
#include "ops/elementwise.h"
#include "ops/rms_norm.h"
#include "test_support.h"

namespace r3::test {
namespace {

TEST(KimiLinearLayers, FirstLayerReproducesTransformersHiddenStates) {
  const Checkpoint c = Checkpoint::open(family_dir("kimi_linear"));
  const models::KdaSpec spec{64, 4, 16, 4, 1e-6f, std::nullopt};
  const models::KdaAttention kda(spec, models::KdaAttention::load(c, "model.layers.0.self_attn.", spec));
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
    auto layer = [&](int64_t first, int64_t n, models::KdaState state, std::vector<float>& out) {
      Tensor x = Tensor::empty(DType::F32, {n, 64});
      for (int64_t i = 0; i < n * 64; ++i) x.data<float>()[i] = static_cast<float>(hidden[first * 64 + i]);
      Tensor normed = Tensor::empty(DType::F32, {n, 64}), branch = Tensor::empty(DType::F32, {n, 64});
      ops::rms_norm(ctx, x, &input_norm, 1e-6f, normed);
      kda.forward_sequence(ctx, normed, state, branch);
      ops::add_rows(ctx, branch, nullptr, x);
      ops::rms_norm(ctx, x, &post_norm, 1e-6f, normed);
      dense.forward(ctx, normed, branch);
      ops::add_rows(ctx, branch, nullptr, x);
      std::copy(x.data<float>(), x.data<float>() + n * 64, out.begin() + first * 64);
    };
    for (const int64_t prefill : {tokens, int64_t{0}, int64_t{7}}) {  // at once, token by token, 7 then one by one
      std::vector<float> conv(static_cast<std::size_t>(kda.conv_state_floats()), 0.0f),
          recurrent(static_cast<std::size_t>(kda.recurrent_state_floats()), 0.0f), got(static_cast<std::size_t>(tokens * 64));
      const models::KdaState state{conv.data(), recurrent.data()};
      if (prefill > 0) layer(0, prefill, state, got);
      for (int64_t t = prefill; t < tokens; ++t) layer(t, 1, state, got);
      double err = 0, scale = 0;
      for (int64_t i = 0; i < tokens * 64; ++i) {
        const double want = hidden[tokens * 64 + i];  // hidden_states[1]
        err = std::max(err, std::abs(got[i] - want));
        scale = std::max(scale, std::abs(want));
      }
      EXPECT_LT(err / scale, 1e-5) << "sequence " << index << ", prefill of " << prefill << " tokens";
    }
  }
}

}  // namespace
}  // namespace r3::test
