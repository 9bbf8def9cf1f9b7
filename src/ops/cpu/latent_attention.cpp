#include "ops/latent_attention.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/dot.h"
#include "ops/cpu/step_blocks.h"

namespace r3::ops::cpu {

void latent_attention(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, std::span<const KvWindow> kv,
                      const LatentAttentionShape& s, float scale, Tensor& out) {
  const int64_t qk = s.nope + s.rope, tokens = q.dim(0);
  R3_CHECK(q.rank() == 2 && q.dim(1) == s.heads * qk && static_cast<int64_t>(kv.size()) == tokens,
           "latent attention: q ", shape_to_string(q.shape()), " for ", kv.size(), " windows");
  R3_CHECK(kv_b.rank() == 2 && kv_b.dim(0) == s.heads * (s.nope + s.value) && kv_b.dim(1) == s.lora,
           "latent attention: kv_b ", shape_to_string(kv_b.shape()));
  R3_CHECK(out.rank() == 2 && out.dim(0) == tokens && out.dim(1) == s.heads * s.value, "latent attention: out ",
           shape_to_string(out.shape()));
  for (const KvWindow& w : kv) {
    R3_CHECK(w.length() == 0 || (w.kv.key_width == s.lora && w.kv.value_width == s.rope),
             "latent attention: cache rows of ", w.kv.key_width, " + ", w.kv.value_width, " floats, expected ", s.lora,
             " + ", s.rope);
  }
  const float* kv_b_rows = kv_b.data<float>();
  const float* qp = q.data<float>();
  float* op = out.data<float>();
  int64_t longest = 0;
  for (const KvWindow& w : kv) longest = std::max(longest, w.length());
  backend::Workspace::Scope scope(ctx.workspace());
  const auto scratch = ctx.per_thread<float>(2 * s.lora + longest);
  ctx.parallel_for(tokens * s.heads, 1, [&](int64_t begin, int64_t end) {
    const std::span<float> mine = scratch.mine();
    const std::span<float> q_latent = mine.first(static_cast<std::size_t>(s.lora));
    const std::span<float> out_latent = mine.subspan(static_cast<std::size_t>(s.lora), static_cast<std::size_t>(s.lora));
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / s.heads, h = th % s.heads;
      float* o = op + t * s.heads * s.value + h * s.value;
      const KvWindow& window = kv[static_cast<std::size_t>(t)];
      if (window.length() == 0) {  // a padding row: nothing to attend to
        std::fill(o, o + s.value, 0.0f);
        continue;
      }
      const float* qh = qp + (t * s.heads + h) * qk;
      const float* w_k = kv_b_rows + h * (s.nope + s.value) * s.lora;  // rows: this head's key part
      const float* w_v = w_k + s.nope * s.lora;                         // rows: this head's value part
      // q_nope through W_k into the latent space.
      std::fill(q_latent.begin(), q_latent.end(), 0.0f);
      for (int64_t i = 0; i < s.nope; ++i) add_scaled(qh[i], w_k + i * s.lora, q_latent.data(), s.lora);
      const std::span<float> scores = mine.subspan(static_cast<std::size_t>(2 * s.lora), static_cast<std::size_t>(window.length()));
      float max_score = -INFINITY;
      window.kv.for_each_run(window.begin, window.end, [&](int64_t first, int64_t n, const float* latents,
                                                           const float* rope_keys) {
        float* sc = scores.data() + (first - window.begin);
        for (int64_t j = 0; j < n; ++j) {
          sc[j] = (dot(q_latent.data(), latents + j * s.lora, s.lora) + dot(qh + s.nope, rope_keys + j * s.rope, s.rope)) *
                  scale;
          max_score = std::max(max_score, sc[j]);
        }
      });
      float denom = 0;
      for (float& x : scores) denom += (x = std::exp(x - max_score));
      std::fill(out_latent.begin(), out_latent.end(), 0.0f);
      window.kv.for_each_run(window.begin, window.end, [&](int64_t first, int64_t n, const float* latents, const float*) {
        const float* sc = scores.data() + (first - window.begin);
        for (int64_t j = 0; j < n; ++j) add_scaled(sc[j] / denom, latents + j * s.lora, out_latent.data(), s.lora);
      });
      for (int64_t i = 0; i < s.value; ++i) o[i] = dot(w_v + i * s.lora, out_latent.data(), s.lora);
    }
  });
}

void latent_attention_paged(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, const StepView& step,
                            const KvPool& pool, const LatentAttentionShape& shape, float scale, Tensor& out) {
  backend::Workspace::Scope scope(ctx.workspace());
  const std::span<KvWindow> windows = step_windows(ctx.workspace(), step, pool, 0, "latent_attention_paged");
  cpu::latent_attention(ctx, q, kv_b, windows, shape, scale, out);
}

}  // namespace r3::ops::cpu
