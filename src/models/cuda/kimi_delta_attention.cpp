// Kimi Delta Attention on the device (models/cuda/device_decoder_parts.h): KdaAttention's
// forward_sequence for every sequence of the step at once, with the recurrent form of the delta
// rule (each run of a sequence's rows in order; the same rounding however a prefill is split).
#include "backend/device_memory.h"
#include "models/cuda/device_decoder_parts.h"
#include "ops/delta_rule.h"
#include "ops/linear.h"
#include "ops/short_conv.h"

namespace r3::models::device {

namespace {

Tensor f32_taps(backend::Context& ctx, const KdaWeights& h) {
  const int64_t width = h.q_conv.dim(0), kernel = h.q_conv.dim(1);
  Tensor taps = Tensor::empty(DType::F32, {3 * width, kernel});
  float* dst = taps.data<float>();
  for (const Tensor* t : {&h.q_conv, &h.k_conv, &h.v_conv}) {
    std::copy(t->data<float>(), t->data<float>() + t->numel(), dst);
    dst += t->numel();
  }
  return backend::to_device(ctx, taps);
}

}  // namespace

KimiDeltaAttention::KimiDeltaAttention(backend::Context& ctx, const KdaAttention& host, DType dtype)
    : spec(host.spec()) {
  R3_CHECK(spec.head_dim <= ops::cuda::kMaxDeviceDeltaRuleHeadDim, "--device cuda: a Kimi Delta Attention head of ",
           spec.head_dim, " (the CUDA kernel holds heads of at most ", ops::cuda::kMaxDeviceDeltaRuleHeadDim,
           " in shared memory); use --device cpu");
  const KdaWeights& h = host.weights();
  qkv = stacked_on_device(ctx, {&h.q, &h.k, &h.v}, dtype);
  if (!qkv.defined()) {
    w.q = on_device(ctx, h.q, dtype);
    w.k = on_device(ctx, h.k, dtype);
    w.v = on_device(ctx, h.v, dtype);
  }
  conv = f32_taps(ctx, h);
  w.f_a = on_device(ctx, h.f_a, dtype);
  w.f_b = on_device(ctx, h.f_b, dtype);
  w.b = on_device(ctx, h.b, dtype);
  w.g_a = on_device(ctx, h.g_a, dtype);
  w.g_b = on_device(ctx, h.g_b, dtype);
  w.g = on_device(ctx, h.g, dtype);
  w.o = on_device(ctx, h.o, dtype);
  w.dt_bias = on_device(ctx, h.dt_bias, DType::F32);
  w.a_log = on_device(ctx, h.a_log, DType::F32);
  w.o_norm = on_device(ctx, h.o_norm, DType::F32);
}

void KimiDeltaAttention::forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step,
                                 const ops::KvPool& pool, Tensor& out) const {
  const int64_t tokens = x.dim(0), width = spec.width(), heads = spec.heads, d = spec.head_dim;
  R3_CHECK(pool.key_width == 3 * width * (spec.conv_kernel - 1) && pool.value_width == heads * d * d && !pool.bf16,
           "KDA (cuda): the cache's states are ", pool.key_width, " + ", pool.value_width, " floats, the layer's ",
           3 * width * (spec.conv_kernel - 1), " + ", heads * d * d);
  backend::Workspace::Scope scope(ctx.workspace());
  auto project = [&](const Tensor& weight, const Tensor& input) {
    Tensor y = ctx.scratch_for_output(DType::F32, {input.dim(0), weight.dim(0)});
    ops::linear(ctx, input, weight, nullptr, y);
    return y;
  };
  // q, k and v, then their convolutions (one kernel over the three).
  ops::cuda::ConvInputs in;
  in.parts = 3;
  in.part_channels = width;
  Tensor projected, q, k, v;
  if (qkv.defined()) {
    projected = project(qkv, x);
    for (int i = 0; i < 3; ++i) in.part[i] = projected.data<float>() + i * width;
    in.stride = 3 * width;
  } else {
    q = project(w.q, x);
    k = project(w.k, x);
    v = project(w.v, x);
    in.part[0] = q.data<float>();
    in.part[1] = k.data<float>();
    in.part[2] = v.data<float>();
    in.stride = width;
  }
  Tensor convolved = ctx.scratch_for_output(DType::F32, {tokens, 3 * width});  // padding rows never read
  ops::cuda::short_conv_silu_step(ctx, in, conv.data<float>(), spec.conv_kernel, step, static_cast<float*>(pool.keys),
                                  convolved.data<float>());
  // The gates' projections, then the fused core.
  const Tensor f = project(w.f_b, project(w.f_a, x));
  const Tensor beta = project(w.b, x);
  const Tensor gate = spec.full_rank_output_gate ? project(w.g, x) : project(w.g_b, project(w.g_a, x));
  const float* c = convolved.data<float>();
  const ops::cuda::DeltaRuleStepRows rows{c, c + width, c + 2 * width, 3 * width, f.data<float>(), beta.data<float>(),
                                          gate.data<float>()};
  ops::cuda::DeltaRuleHeadWeights head;
  head.a_log = w.a_log.data<float>();
  head.dt_bias = w.dt_bias.data<float>();
  head.norm = w.o_norm.data<float>();
  head.eps = spec.rms_eps;
  head.bounded = spec.gate_lower_bound.has_value();
  head.lower_bound = spec.gate_lower_bound.value_or(0.0f);
  Tensor core = ctx.scratch_for_output(DType::F32, {tokens, width});
  ops::cuda::gated_delta_rule_step(ctx, heads, d, rows, head, step, static_cast<float*>(pool.values), core.data<float>());
  ops::linear(ctx, core, w.o, nullptr, out);
}

}  // namespace r3::models::device
