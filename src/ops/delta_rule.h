// Kimi Delta Attention's core (Kimi Linear, Kimi K3): the gated delta rule with one decay per key
// channel, over one sequence's rows and its recurrent state, in the two forms transformers has:
// the recurrent one (token by token, for decode) and the chunked one (the WY/UT form over chunks
// of positions, for prefill). They are the same function of their inputs; only the rounding
// differs. Per head h, with q and k L2-normalised (x / sqrt(sum x² + 1e-6)) and q scaled by
// 1 / sqrt(dk), each token t does
//   S ← diag(exp(g_t)) S                       (S: [dk, dv], row i decays by exp(g_t[i]))
//   S ← S + k_t (beta_t (v_t - k_tᵀ S))ᵀ        (the delta rule: write what S mispredicts)
//   o_t = q_tᵀ S
// Also here: the log-decays from the forget-gate projection (both published forms) and the
// per-head gated RMSNorm of the output.
#pragma once

#include <cstdint>

#include "backend/dispatch.h"
#include "ops/step_view.h"

// Head dimensions up to kMaxDeltaRuleHeadDim (the recurrent form keeps a head's normalised q and k
// on the stack).

namespace r3::ops {

constexpr int64_t kMaxDeltaRuleHeadDim = 512;

struct DeltaRuleShape {
  int64_t heads = 0;
  int64_t key_dim = 0;    // dk per head
  int64_t value_dim = 0;  // dv per head
};

// One sequence's rows, row-major: q, k, g [tokens, heads, dk]; v [tokens, heads, dv]; beta
// [tokens, heads]; out [tokens, heads, dv]; state [heads, dk, dv], read and updated. q and k are
// normalised and scaled inside (their buffers are left as given).
struct DeltaRuleRows {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;  // log-decays (<= 0)
  const float* beta = nullptr;
  int64_t tokens = 0;
  float* out = nullptr;
};

// Token by token (transformers' recurrent_kimi_delta_attention).
void delta_rule_recurrent(const DeltaRuleShape& shape, const DeltaRuleRows& rows, float* state);

// Chunks of `chunk` positions (transformers' chunk_kimi_delta_attention with chunk_size 64; a last
// partial chunk is taken as it is, which is what zero padding amounts to). scratch: at least
// delta_rule_chunked_scratch(shape, chunk) doubles.
void delta_rule_chunked(const DeltaRuleShape& shape, const DeltaRuleRows& rows, int64_t chunk, float* state,
                        double* scratch);
int64_t delta_rule_chunked_scratch(const DeltaRuleShape& shape, int64_t chunk);

// Log-decays from the forget-gate projection f [tokens, heads * dk] (f_b_proj(f_a_proj(x))):
// Kimi Linear's g = -exp(A_log[h]) * softplus(f + dt_bias) (softplus(x) = x above 20), or, with a
// lower bound (Kimi K3's gate_lower_bound), g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)).
// a_log: [heads]; dt_bias: [heads * dk]; g: [tokens, heads * dk] (may alias f).
void delta_rule_log_decay(const float* f, int64_t tokens, const DeltaRuleShape& shape, const float* a_log,
                          const float* dt_bias, const float* lower_bound, float* g);

// The output's per-head gated RMSNorm: y = x / sqrt(mean(x²) + eps) * weight * sigmoid(gate),
// over each head's dv values. x, gate, y: [rows, heads * dv] (y may alias x); weight: [dv].
void gated_rms_norm_heads(const float* x, const float* gate, const float* weight, int64_t rows, int64_t heads,
                          int64_t dv, float eps, float* y);

// A KDA layer's rows after the convolutions: row t, head h of q at q + t * qkv_stride + h * dim (k,
// v likewise), and the projections of the forget gate [tokens, heads * dim], beta (before the
// sigmoid) [tokens, heads] and the output gate [tokens, heads * dim].
struct DeltaRuleStepRows {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qkv_stride = 0;
  const float* f = nullptr;
  const float* beta = nullptr;
  const float* gate = nullptr;
};
struct DeltaRuleHeadWeights {
  const float* a_log = nullptr;    // [heads]
  const float* dt_bias = nullptr;  // [heads * dim]
  const float* norm = nullptr;     // the gated norm's weight [dim]
  float eps = 1e-6f;
  bool bounded = false;            // Kimi K3's gate: lower_bound * sigmoid(...)
  float lower_bound = 0.0f;
};

namespace cpu {  // ops/delta_rule.cpp
inline int64_t max_delta_rule_step_head_dim(backend::Context&) { return kMaxDeltaRuleHeadDim; }
void gated_delta_rule_step(backend::Context& ctx, int64_t heads, int64_t dim, const DeltaRuleStepRows& rows,
                           const DeltaRuleHeadWeights& w, const StepView& step, float* state, float* out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_delta_rule.cu
// Key and value head dimensions are equal, at most kMaxDeviceDeltaRuleHeadDim (a head's state
// is held in shared memory while its run is processed); one kernel.
constexpr int64_t kMaxDeviceDeltaRuleHeadDim = 128;
inline int64_t max_delta_rule_step_head_dim(backend::Context&) { return kMaxDeviceDeltaRuleHeadDim; }
void gated_delta_rule_step(backend::Context& ctx, int64_t heads, int64_t dim, const DeltaRuleStepRows& rows,
                           const DeltaRuleHeadWeights& w, const StepView& step, float* state, float* out);
}  // namespace cuda
#endif

// The largest head dimension gated_delta_rule_step runs with on ctx's device (a layer asks before
// it is placed there).
inline int64_t max_delta_rule_step_head_dim(backend::Context& ctx) {
  R3_DISPATCH_GPU(ctx, max_delta_rule_step_head_dim, ctx);
}

// A KDA layer's core over a step's rows: for every sequence's run of consecutive rows (one run a
// sequence) and head, the log-decays from the forget-gate projection (delta_rule_log_decay), beta
// = sigmoid of its projection, the recurrent delta rule continuing the sequence's state
// (delta_rule_recurrent, in float32) and the output's gated RMSNorm (gated_rms_norm_heads).
// Padding rows get zeros. state: [slots, heads, dim, dim] (each sequence slot's recurrent state);
// out: [tokens, heads * dim]. All float32 on ctx's device.
inline void gated_delta_rule_step(backend::Context& ctx, int64_t heads, int64_t dim, const DeltaRuleStepRows& rows,
                                  const DeltaRuleHeadWeights& w, const StepView& step, float* state, float* out) {
  R3_DISPATCH_GPU(ctx, gated_delta_rule_step, ctx, heads, dim, rows, w, step, state, out);
}

}  // namespace r3::ops
