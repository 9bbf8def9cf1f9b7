#include "models/kda_attention.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "models/kv_cache.h"
#include "models/weights_on_device.h"
#include "ops/delta_rule.h"
#include "ops/linear.h"
#include "ops/short_conv.h"

namespace r3::models {

namespace {

constexpr int64_t kChunk = 64;  // transformers' chunk_size for the chunked form

}  // namespace

KdaAttention::KdaAttention(const KdaSpec& spec, KdaWeights weights) : spec_(spec), w_(std::move(weights)) {
  R3_CHECK(spec_.hidden > 0 && spec_.heads > 0 && spec_.head_dim > 0 && spec_.head_dim <= ops::kMaxDeltaRuleHeadDim &&
               spec_.conv_kernel >= 1 && spec_.conv_kernel <= 64,
           "KDA: ", spec_.heads, " heads of ", spec_.head_dim, ", hidden ", spec_.hidden, ", convolution of ",
           spec_.conv_kernel, " taps");
  R3_CHECK(w_.conv.defined() && w_.conv.rank() == 2 && w_.conv.dim(0) == 3 * spec_.width() &&
               w_.conv.dim(1) == spec_.conv_kernel,
           "KDA: stacked convolution taps of ", shape_to_string(w_.conv.shape()), " for width ", spec_.width(),
           " and ", spec_.conv_kernel, " taps");
}

std::unique_ptr<AttentionLayer> KdaAttention::placed(backend::Context& ctx, DType dtype) const {
  const int64_t most = ops::max_delta_rule_step_head_dim(ctx);
  R3_CHECK(spec_.head_dim <= most, "--device ", device_name(ctx.device()), ": a Kimi Delta Attention head of ",
           spec_.head_dim, " (the delta rule's step there holds heads of at most ", most, "); use --device cpu");
  KdaWeights d;
  d.qkv = stacked_on_device(ctx, {&w_.q, &w_.k, &w_.v}, dtype);
  if (!d.qkv.defined()) {
    d.q = on_device(ctx, w_.q, dtype);
    d.k = on_device(ctx, w_.k, dtype);
    d.v = on_device(ctx, w_.v, dtype);
  }
  d.conv = on_device(ctx, w_.conv, DType::F32);
  d.f_a = on_device(ctx, w_.f_a, dtype);
  d.f_b = on_device(ctx, w_.f_b, dtype);
  d.b = on_device(ctx, w_.b, dtype);
  d.g_a = on_device(ctx, w_.g_a, dtype);
  d.g_b = on_device(ctx, w_.g_b, dtype);
  d.g = on_device(ctx, w_.g, dtype);
  d.o = on_device(ctx, w_.o, dtype);
  d.dt_bias = on_device(ctx, w_.dt_bias, DType::F32);
  d.a_log = on_device(ctx, w_.a_log, DType::F32);
  d.o_norm = on_device(ctx, w_.o_norm, DType::F32);
  return std::make_unique<KdaAttention>(spec_, std::move(d));
}

KdaWeights KdaAttention::load(ParameterLoader& c, const std::string& p, const KdaSpec& s, int64_t layer) {
  const ParameterSite site{layer, -1};
  const int64_t width = s.width(), hidden = s.hidden, d = s.head_dim;
  KdaWeights w;
  w.q = c.load_weight(p + "q_proj.weight", {width, hidden}, site);
  w.k = c.load_weight(p + "k_proj.weight", {width, hidden}, site);
  w.v = c.load_weight(p + "v_proj.weight", {width, hidden}, site);
  // The three convolutions' taps, stacked once as the step's convolution takes them; each tap
  // tensor (and its parameter) is a view of its rows.
  w.conv = Tensor::empty(DType::F32, {3 * width, s.conv_kernel});
  Tensor* taps[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
  const char* names[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
  for (int i = 0; i < 3; ++i) {
    const Tensor loaded = c.load_f32(p + names[i], {width, 1, s.conv_kernel}, site);
    Tensor rows = w.conv.rows(i * width, (i + 1) * width);
    std::copy_n(loaded.data<float>(), loaded.numel(), rows.data<float>());
    c.relocate(p + names[i], rows.reshaped({width, 1, s.conv_kernel}));
    *taps[i] = rows;
  }
  w.f_a = c.load_weight(p + "f_a_proj.weight", {d, hidden}, site);
  w.f_b = c.load_weight(p + "f_b_proj.weight", {width, d}, site);
  w.dt_bias = c.load_f32(p + "dt_bias", {width}, site);
  w.a_log = c.load_f32(p + "A_log", {1, 1, s.heads, 1}, site).reshaped({s.heads});
  w.b = c.load_weight(p + "b_proj.weight", {s.heads, hidden}, site);
  if (s.full_rank_output_gate) {
    w.g = c.load_weight(p + "g_proj.weight", {width, hidden}, site);
  } else {
    w.g_a = c.load_weight(p + "g_a_proj.weight", {d, hidden}, site);
    w.g_b = c.load_weight(p + "g_b_proj.weight", {width, d}, site);
  }
  w.o_norm = c.load_f32(p + "o_norm.weight", {d}, site);
  w.o = c.load_weight(p + "o_proj.weight", {hidden, width}, site);
  return w;
}

void KdaAttention::forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache,
                           int64_t layer, Tensor& out) const {
  const int64_t tokens = x.dim(0), width = spec_.width(), heads = spec_.heads, d = spec_.head_dim;
  const ops::KvPool pool = cache.pool(layer);
  R3_CHECK(pool.key_width == conv_state_floats() && pool.value_width == recurrent_state_floats() && !pool.bf16,
           "KDA layer ", layer, ": the cache's states are ", pool.key_width, " + ", pool.value_width,
           " floats, the layer's ", conv_state_floats(), " + ", recurrent_state_floats());
  backend::Workspace::Scope scope(ctx.workspace());
  // Every buffer here is written in full by the op that fills it (padding rows of `convolved`
  // are never read): no fills (see GqaAttention).
  auto project = [&](const Tensor& weight, const Tensor& input) {
    Tensor y = ctx.scratch_for_output(DType::F32, {input.dim(0), weight.dim(0)});
    ops::linear(ctx, input, weight, nullptr, y);
    return y;
  };
  // q, k and v, then their convolutions (one op over the three).
  ops::ConvInputs in;
  in.parts = 3;
  in.part_channels = width;
  Tensor projected, q, k, v;
  if (w_.qkv.defined()) {
    projected = project(w_.qkv, x);
    for (int i = 0; i < 3; ++i) in.part[i] = projected.data<float>() + i * width;
    in.stride = 3 * width;
  } else {
    q = project(w_.q, x);
    k = project(w_.k, x);
    v = project(w_.v, x);
    in.part[0] = q.data<float>();
    in.part[1] = k.data<float>();
    in.part[2] = v.data<float>();
    in.stride = width;
  }
  Tensor convolved = ctx.scratch_for_output(DType::F32, {tokens, 3 * width});
  ops::short_conv_silu_step(ctx, in, w_.conv.data<float>(), spec_.conv_kernel, step, static_cast<float*>(pool.keys),
                            convolved.data<float>());
  // The gates' projections, then the core.
  const Tensor f = project(w_.f_b, project(w_.f_a, x));
  const Tensor beta = project(w_.b, x);
  const Tensor gate = spec_.full_rank_output_gate ? project(w_.g, x) : project(w_.g_b, project(w_.g_a, x));
  const float* c = convolved.data<float>();
  const ops::DeltaRuleStepRows rows{c, c + width, c + 2 * width, 3 * width, f.data<float>(), beta.data<float>(),
                                    gate.data<float>()};
  ops::DeltaRuleHeadWeights head;
  head.a_log = w_.a_log.data<float>();
  head.dt_bias = w_.dt_bias.data<float>();
  head.norm = w_.o_norm.data<float>();
  head.eps = spec_.rms_eps;
  head.bounded = spec_.gate_lower_bound.has_value();
  head.lower_bound = spec_.gate_lower_bound.value_or(0.0f);
  Tensor core = ctx.scratch_for_output(DType::F32, {tokens, width});
  ops::gated_delta_rule_step(ctx, heads, d, rows, head, step, static_cast<float*>(pool.values), core.data<float>());
  ops::linear(ctx, core, w_.o, nullptr, out);
}

void KdaAttention::forward_sequence(backend::Context& ctx, const Tensor& x, KdaState state, Tensor& out,
                                    bool chunked) const {
  const int64_t tokens = x.dim(0), width = spec_.width(), d = spec_.head_dim, kept = spec_.conv_kernel - 1;
  R3_CHECK(x.rank() == 2 && x.dim(1) == spec_.hidden && out.rank() == 2 && out.dim(0) == tokens &&
               out.dim(1) == spec_.hidden,
           "KDA: x ", shape_to_string(x.shape()), ", out ", shape_to_string(out.shape()));
  if (tokens == 0) return;
  backend::Workspace::Scope scope(ctx.workspace());
  auto project = [&](const Tensor& weight, const Tensor& input) {
    Tensor y = ctx.scratch(DType::F32, {input.dim(0), weight.dim(0)});
    ops::linear(ctx, input, weight, nullptr, y);
    return y;
  };
  // q, k, v through their short convolutions (channels are independent: three calls over the
  // state's three parts are the packed convolution of transformers).
  Tensor q = ctx.scratch(DType::F32, {tokens, width}), k = ctx.scratch(DType::F32, {tokens, width}),
         v = ctx.scratch(DType::F32, {tokens, width});
  const Tensor* weights[3] = {&w_.q_conv, &w_.k_conv, &w_.v_conv};
  const Tensor* projections[3] = {&w_.q, &w_.k, &w_.v};
  Tensor* convolved[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    const Tensor projected = project(*projections[i], x);
    ops::short_conv_silu(projected.data<float>(), tokens, width, weights[i]->data<float>(), spec_.conv_kernel,
                         state.conv + i * width * kept, convolved[i]->data<float>());
  }
  // Per-channel log-decays and beta.
  Tensor g = project(w_.f_b, project(w_.f_a, x));
  const ops::DeltaRuleShape shape{spec_.heads, d, d};
  const float lower_bound = spec_.gate_lower_bound.value_or(0.0f);
  ops::delta_rule_log_decay(g.data<float>(), tokens, shape, w_.a_log.data<float>(), w_.dt_bias.data<float>(),
                            spec_.gate_lower_bound ? &lower_bound : nullptr, g.data<float>());
  Tensor beta = project(w_.b, x);
  for (int64_t i = 0; i < beta.numel(); ++i) {
    beta.data<float>()[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(beta.data<float>()[i]))));
  }
  // The delta rule: recurrent, or chunked over several tokens.
  Tensor core = ctx.scratch(DType::F32, {tokens, width});
  const ops::DeltaRuleRows rows{q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                                beta.data<float>(), tokens, core.data<float>()};
  if (tokens == 1 || !chunked) {
    ops::delta_rule_recurrent(shape, rows, state.recurrent);
  } else {
    Tensor scratch = ctx.scratch(DType::F64, {ops::delta_rule_chunked_scratch(shape, kChunk)});
    ops::delta_rule_chunked(shape, rows, kChunk, state.recurrent, scratch.data<double>());
  }
  // The gated norm with the output gate, then o_proj.
  const Tensor gate = spec_.full_rank_output_gate ? project(w_.g, x) : project(w_.g_b, project(w_.g_a, x));
  ops::gated_rms_norm_heads(core.data<float>(), gate.data<float>(), w_.o_norm.data<float>(), tokens, spec_.heads, d,
                            spec_.rms_eps, core.data<float>());
  ops::linear(ctx, core, w_.o, nullptr, out);
}

}  // namespace r3::models
