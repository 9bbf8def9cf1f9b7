// Kimi Delta Attention (KDA), the linear-attention layer of Kimi Linear and Kimi K3, over one
// sequence's rows and that sequence's state (transformers 5.17's KimiLinearDeltaAttention):
// q, k and v projections, each through the causal short convolution with SiLU
// (ops/short_conv.h), the forget gate's per-channel log-decays from a low-rank projection, beta
// from b_proj, the gated delta rule (ops/delta_rule.h), the per-head gated RMSNorm with the output
// gate (low-rank g_a/g_b in Kimi Linear, full-rank g_proj in Kimi K3), and o_proj. One definition
// for every device, as GqaAttention: a step runs the step-view ops (ops::short_conv_silu_step,
// ops::gated_delta_rule_step) over every sequence's run at once, in the recurrent form.
// A sequence's state is fixed-size whatever its length: the last kernel - 1 inputs of each
// convolution channel and the recurrent state [heads, head_dim, head_dim].
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/context.h"
#include "core/tensor.h"
#include "models/attention_layer.h"
#include "models/parameter_table.h"

namespace r3::models {

struct KdaSpec {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;     // key and value dimension per head
  int64_t conv_kernel = 0;  // short convolution taps
  float rms_eps = 1e-6f;    // of the output's gated norm
  std::optional<float> gate_lower_bound;  // Kimi K3's bounded forget gate; none for Kimi Linear
  bool full_rank_output_gate = false;     // Kimi K3's g_proj instead of g_a_proj / g_b_proj

  int64_t width() const { return heads * head_dim; }
};

struct KdaWeights {
  Tensor q, k, v;           // [width, hidden]
  Tensor q_conv, k_conv, v_conv;  // [width, kernel], rows of `conv`
  Tensor f_a, f_b;          // forget gate: [head_dim, hidden], [width, head_dim]
  Tensor dt_bias;           // [width]
  Tensor a_log;             // [heads]
  Tensor b;                 // beta: [heads, hidden]
  Tensor g_a, g_b;          // low-rank output gate: [head_dim, hidden], [width, head_dim]
  Tensor g;                 // full-rank output gate: [width, hidden]
  Tensor o_norm;            // [head_dim]
  Tensor o;                 // [hidden, width]
  // The three convolutions' taps stacked [3 width, kernel] (q, k, then v channels), as the step's
  // convolution takes them; q_conv, k_conv and v_conv are views of its rows (load makes them).
  Tensor conv;
  // q, k and v as one projection [3 width, hidden] (q, k, v then empty): made by `placed` where
  // they stack.
  Tensor qkv;
};

// One sequence's state: conv [3 * width, kernel - 1] (q, k, then v channels), recurrent
// [heads, head_dim, head_dim]; zeros before the sequence's first token.
struct KdaState {
  float* conv = nullptr;
  float* recurrent = nullptr;
};

class KdaAttention final : public AttentionLayer {
 public:
  KdaAttention(const KdaSpec& spec, KdaWeights weights);
  // Kimi Linear's checkpoint names under `prefix` (e.g. "model.layers.0.self_attn."): q/k/v_proj,
  // q/k/v_conv1d [width, 1, kernel], f_a_proj, f_b_proj, dt_bias, A_log [1, 1, heads, 1],
  // b_proj, g_a_proj, g_b_proj (g_proj [width, hidden] when spec.full_rank_output_gate), o_norm,
  // o_proj: layer `layer`'s weights, each recorded in the model's parameter table.
  static KdaWeights load(ParameterLoader& params, const std::string& prefix, const KdaSpec& spec, int64_t layer);

  // This layer with its weights on ctx's device: projections as `dtype` (or as stored when
  // quantized), q, k and v stacked where they may be; the rest float32. The host-only
  // forward_sequence is not for the copy (it keeps only the stacked taps).
  std::unique_ptr<AttentionLayer> placed(backend::Context& ctx, DType dtype) const override;

  const KdaSpec& spec() const { return spec_; }
  const KdaWeights& weights() const { return w_; }
  int64_t conv_state_floats() const { return 3 * spec_.width() * (spec_.conv_kernel - 1); }
  int64_t recurrent_state_floats() const { return spec_.heads * spec_.head_dim * spec_.head_dim; }

  // A fixed-size state per sequence, no rows.
  CacheSpec cache_spec() const override {
    return CacheSpec::recurrent_state(conv_state_floats(), recurrent_state_floats());
  }
  // Each sequence's run of rows of the step (one run a sequence, continuing its cached length:
  // check_runs_continue_states, which the decoders call) with its state in `cache`; padding rows
  // give zeros. The recurrent form, whose rounding does not depend on where a prefill is split
  // into steps: rows are bit-identical however a request is split or batched.
  void forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache, int64_t layer,
               Tensor& out) const override;
  // x: one sequence's normalised hidden rows F32 [tokens, hidden], continuing `state` (which it
  // updates); out: F32 [tokens, hidden]. chunked: the delta rule's chunked form (same function,
  // other rounding) instead of the recurrent one. On the host, as transformers runs it (tests).
  void forward_sequence(backend::Context& ctx, const Tensor& x, KdaState state, Tensor& out, bool chunked) const;

 private:
  KdaSpec spec_;
  KdaWeights w_;
};

}  // namespace r3::models
