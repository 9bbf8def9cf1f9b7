// The step-view attention ops on the CPU (ops/step_view.h): each token's pool rows and window
// taken from the step's block tables, then the same arithmetic as the KvWindow ops
// (cpu::attention, cpu::write_kv, cpu::rotary, cpu::rms_norm), so a layer gives the same bits
// whichever form it calls.
#include <cstring>

#include "ops/attention.h"
#include "ops/kv_write.h"
#include "ops/rms_norm.h"
#include "ops/rotary.h"
#include "ops/cpu/step_blocks.h"

namespace r3::ops::cpu {

void paged_attention(backend::Context& ctx, const Tensor& q, const StepView& step, const KvPool& pool,
                     int64_t num_kv_heads, float scale, int64_t sliding_window, const float* sinks, Tensor& out) {
  R3_CHECK(q.rank() == 3 && q.dim(0) == step.tokens, "paged_attention: q ", shape_to_string(q.shape()), " for ",
           step.tokens, " tokens");
  backend::Workspace::Scope scope(ctx.workspace());
  const std::span<KvWindow> windows = step_windows(ctx.workspace(), step, pool, sliding_window, "paged_attention");
  cpu::attention(ctx, q, windows, num_kv_heads, scale, out, sinks);
}

void prepare_attention_rows(backend::Context& ctx, const Rotary& rope, const AttentionRows& rows, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, float eps, const StepView& step, const KvPool& pool,
                            Tensor& q_out) {
  const int64_t tokens = step.tokens, q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  R3_CHECK(q_out.dtype() == DType::F32 && q_out.is_contiguous() && q_out.numel() == tokens * q_width,
           "prepare_attention_rows: q_out ", shape_to_string(q_out.shape()), " for ", tokens, " x ", heads, " x ",
           head_dim);
  R3_CHECK(pool.key_width == kv_width && pool.value_width == kv_width, "prepare_attention_rows: pool rows of ",
           pool.key_width, "/", pool.value_width, " floats for ", kv_heads, " x ", head_dim);
  R3_CHECK((rows.q_norm == nullptr) == (rows.k_norm == nullptr), "prepare_attention_rows: q and k norms go together");
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor q = q_out.reshaped({tokens, heads, head_dim});
  Tensor k = ctx.scratch_for_output(DType::F32, {tokens, kv_heads, head_dim});
  for (int64_t t = 0; t < tokens; ++t) {
    float* q_row = q.data<float>() + t * q_width;
    const float* q_in = rows.q + t * rows.q_stride;
    if (q_in != q_row) std::memmove(q_row, q_in, sizeof(float) * static_cast<std::size_t>(q_width));
    std::memcpy(k.data<float>() + t * kv_width, rows.k + t * rows.k_stride, sizeof(float) * static_cast<std::size_t>(kv_width));
  }
  if (rows.q_norm != nullptr) {  // over head_dim of every head
    const Tensor q_norm = Tensor::view(DType::F32, {head_dim}, const_cast<float*>(rows.q_norm), nullptr);
    const Tensor k_norm = Tensor::view(DType::F32, {head_dim}, const_cast<float*>(rows.k_norm), nullptr);
    Tensor qh = q.reshaped({tokens * heads, head_dim});
    Tensor kh = k.reshaped({tokens * kv_heads, head_dim});
    cpu::rms_norm(ctx, qh, &q_norm, eps, qh);
    cpu::rms_norm(ctx, kh, &k_norm, eps, kh);
  }
  const std::span<const int32_t> positions(step.positions, static_cast<std::size_t>(tokens));
  cpu::rotary(rope, q, positions);
  cpu::rotary(rope, k, positions);
  const std::span<KvWrite> writes = step_writes(ctx.workspace(), step, pool, "prepare_attention_rows");
  cpu::write_kv(k.data<float>(), kv_width, rows.v, rows.v_stride, writes);
}

}  // namespace r3::ops::cpu
