#include "models/kda_attention.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "models/kv_cache.h"
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
}

KdaWeights KdaAttention::load(ParameterLoader& c, const std::string& p, const KdaSpec& s, int64_t layer) {
  const ParameterSite site{layer, -1};
  const int64_t width = s.width(), hidden = s.hidden, d = s.head_dim;
  KdaWeights w;
  w.q = c.load_weight(p + "q_proj.weight", {width, hidden}, site);
  w.k = c.load_weight(p + "k_proj.weight", {width, hidden}, site);
  w.v = c.load_weight(p + "v_proj.weight", {width, hidden}, site);
  w.q_conv = c.load_f32(p + "q_conv1d.weight", {width, 1, s.conv_kernel}, site).reshaped({width, s.conv_kernel});
  w.k_conv = c.load_f32(p + "k_conv1d.weight", {width, 1, s.conv_kernel}, site).reshaped({width, s.conv_kernel});
  w.v_conv = c.load_f32(p + "v_conv1d.weight", {width, 1, s.conv_kernel}, site).reshaped({width, s.conv_kernel});
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
  const int64_t tokens = x.dim(0);
  for (int64_t t = 0; t < tokens;) {
    const int32_t seq = step.seqs[t];
    if (seq < 0) {  // a padding row
      std::fill(out.data<float>() + t * spec_.hidden, out.data<float>() + (t + 1) * spec_.hidden, 0.0f);
      ++t;
      continue;
    }
    int64_t end = t + 1;
    while (end < tokens && step.seqs[end] == seq &&
           step.positions[end] == step.positions[end - 1] + 1) {
      ++end;
    }
    // The state has taken in exactly the sequence's cached positions: the run must continue them.
    R3_CHECK(step.positions[t] == cache.length(seq), "KDA layer ", layer, ": sequence ", seq,
             "'s rows start at position ", step.positions[t], " but its state holds ",
             cache.length(seq), " positions (a sequence's rows of a step must be consecutive)");
    const KvCache::SequenceState state = cache.state(layer, seq);
    Tensor rows_out = out.rows(t, end);
    forward_sequence(ctx, x.rows(t, end), {state.first, state.second}, rows_out, !ctx.batch_invariant());
    t = end;
  }
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
