// Multi-head latent attention (DeepSeek-V2/V3 MLA) over a paged cache of compressed latents and
// shared rotary keys. Per head, the no-position part of the query goes through W_k into the
// latent space, scores are taken against the cached latents (plus the rotary part against the
// rotary keys), and the weighted sum of latents comes back out through W_v: keys and values are
// never expanded per head.
#pragma once

#include "backend/dispatch.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/step_view.h"

namespace r3::ops {

struct LatentAttentionShape {
  int64_t heads = 0;
  int64_t nope = 0;  // qk_nope_head_dim
  int64_t rope = 0;  // qk_rope_head_dim
  int64_t value = 0; // v_head_dim
  int64_t lora = 0;  // kv_lora_rank
};

// q: F32 [tokens, heads * (nope + rope)], rotary part already rotated; kv_b: F32
// [heads * (nope + value), lora] (each head's W_k rows, then its W_v rows); one KvWindow per token
// over the paged cache, whose key rows are latents (lora floats) and value rows rotary keys
// (rope floats); an empty window (padding) gives zeros. out: F32 [tokens, heads * value].
namespace cpu {
void latent_attention(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, std::span<const KvWindow> kv,
                      const LatentAttentionShape& shape, float scale, Tensor& out);
void latent_attention_paged(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, const StepView& step,
                            const KvPool& pool, const LatentAttentionShape& shape, float scale, Tensor& out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_latent_attention.cu
// latent_attention_paged below, on the device (kv_b F32 or BF16).
void latent_attention_paged(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, const StepView& step,
                            const KvPool& pool, const LatentAttentionShape& shape, float scale, Tensor& out);
}
#endif
inline void latent_attention(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, std::span<const KvWindow> kv,
                             const LatentAttentionShape& shape, float scale, Tensor& out) {
  R3_DISPATCH(ctx, latent_attention, ctx, q, kv_b, kv, shape, scale, out);
}

// The same with each token's window, positions [0, pos] of its sequence, taken through the step's
// block tables (ops/step_view.h) into `pool`, whose key rows are latents (lora floats) and value
// rows rotary keys (rope floats); a padding row gives zeros. q, kv_b, out on ctx's device.
inline void latent_attention_paged(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, const StepView& step,
                                   const KvPool& pool, const LatentAttentionShape& shape, float scale, Tensor& out) {
  R3_DISPATCH_GPU(ctx, latent_attention_paged, ctx, q, kv_b, step, pool, shape, scale, out);
}

}  // namespace r3::ops
