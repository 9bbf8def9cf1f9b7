#include "models/deepseek_v4/v4_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "models/deepseek_v4/hyper_connection.h"
#include "ops/grouped_projection.h"
#include "ops/lightning_indexer.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/softmax_attention.h"
#include "ops/topk.h"

namespace r3::models {

V4Attention::V4Attention(const DeepseekV4Spec& spec, int64_t layer, V4AttentionWeights weights,
                         std::optional<WindowCompressor> compressor, std::optional<WindowCompressor> indexer,
                         const ops::TrailingInterleavedRotary& rotary,
                         const ops::TrailingInterleavedRotary& compress_rotary)
    : layer_(layer),
      kind_(spec.layer_kinds[static_cast<std::size_t>(layer)]),
      heads_(spec.num_heads),
      head_dim_(spec.head_dim),
      q_lora_(spec.q_lora_rank),
      groups_(spec.o_groups),
      o_lora_(spec.o_lora_rank),
      window_(spec.sliding_window),
      index_heads_(spec.index_heads),
      index_dim_(spec.index_head_dim),
      index_topk_(spec.index_topk),
      rms_eps_(static_cast<float>(spec.rms_norm_eps)),
      w_(std::move(weights)),
      compressor_(std::move(compressor)),
      indexer_(std::move(indexer)),
      rotary_(rotary),
      compress_rotary_(compress_rotary) {}

std::vector<int64_t> V4Attention::visible_entries(const float* index_q, const float* index_w, int64_t pos,
                                                  const CompressorState* index_state, int64_t num_entries) const {
  const int64_t ready = std::min(num_entries, (pos + 1) / compressor_->rate());  // causal: complete windows
  std::vector<int64_t> entries;
  if (kind_ != V4AttentionKind::kCompressed) {
    for (int64_t s = 0; s < ready; ++s) entries.push_back(s);
    return entries;
  }
  // Lightning indexer: score_s = sum_h w_h * relu(q_h . K_s) / sqrt(Di) over every entry the
  // cache holds, -inf for those not yet complete at this query; keep the top index_topk that
  // are complete. The selection follows PyTorch's CPU top-k, ties included (see topk.h), over
  // the same row the reference sees: all entries present when the step runs.
  std::vector<float> score(static_cast<std::size_t>(num_entries), -INFINITY);
  ops::lightning_index_scores(index_q, index_w, index_state->entries.data(), ready, index_heads_, index_dim_,
                              score.data());
  for (int32_t s : ops::torch_cpu_topk_set(score, std::min(index_topk_, num_entries))) {
    if (s < ready) entries.push_back(s);
  }
  std::sort(entries.begin(), entries.end());
  return entries;
}

void V4Attention::forward(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch, V4Cache& cache,
                          Tensor& out) const {
  const int64_t tokens = x.dim(0), d = head_dim_;
  // Queries through the LoRA: latent RMSNorm, then an unweighted RMSNorm per head, then rotary.
  Tensor q_latent = Tensor::empty(DType::F32, {tokens, q_lora_});
  ops::linear(ctx, x, w_.wq_a, nullptr, q_latent);
  ops::rms_norm(ctx, q_latent, &w_.q_norm, rms_eps_, q_latent);
  Tensor q = Tensor::empty(DType::F32, {tokens, heads_ * d});
  ops::linear(ctx, q_latent, w_.wq_b, nullptr, q);
  Tensor q_heads = q.reshaped({tokens * heads_, d});
  ops::rms_norm(ctx, q_heads, nullptr, rms_eps_, q_heads);
  // The shared K=V row.
  Tensor kv = Tensor::empty(DType::F32, {tokens, d});
  ops::linear(ctx, x, w_.wkv, nullptr, kv);
  ops::rms_norm(ctx, kv, &w_.kv_norm, rms_eps_, kv);

  std::vector<V4LayerState*> states(static_cast<std::size_t>(tokens), nullptr);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = batch.positions[t];
    rotary_.apply(q.data<float>() + t * heads_ * d, heads_, d, p);
    rotary_.apply(kv.data<float>() + t * d, 1, d, p);
    if (batch.slots[t] == ForwardBatch::kPadding) continue;
    states[t] = &cache.layer(layer_, batch.slots[t]);
    std::memcpy(states[t]->kv.data() + p * d, kv.data<float>() + t * d, sizeof(float) * static_cast<std::size_t>(d));
  }

  // Compressed entries (and the indexer's) for every window completed by this step.
  Tensor index_q, index_w;
  if (compressor_) {
    std::vector<CompressorState*> comp(states.size(), nullptr), idx(states.size(), nullptr);
    for (std::size_t t = 0; t < states.size(); ++t) {
      if (states[t]) {
        comp[t] = &states[t]->compressor;
        idx[t] = &states[t]->indexer;
      }
    }
    compressor_->store(ctx, x, batch.positions, comp);
    if (indexer_) indexer_->store(ctx, x, batch.positions, idx);
    for (int64_t t = 0; t < tokens; ++t) {
      if (!states[t]) continue;
      compressor_->emit(states[t]->compressor, batch.positions[t] + 1);
      if (indexer_) indexer_->emit(states[t]->indexer, batch.positions[t] + 1);
    }
    if (indexer_) {
      index_q = Tensor::empty(DType::F32, {tokens, index_heads_ * index_dim_});
      ops::linear(ctx, q_latent, w_.index_wq_b, nullptr, index_q);
      index_w = Tensor::empty(DType::F32, {tokens, index_heads_});
      ops::linear(ctx, x, w_.index_weights_proj, nullptr, index_w);
      const float weight_scale = 1.0f / std::sqrt(static_cast<float>(index_heads_));
      for (int64_t t = 0; t < tokens; ++t) {
        compress_rotary_.apply(index_q.data<float>() + t * index_heads_ * index_dim_, index_heads_, index_dim_,
                               batch.positions[t]);
        for (int64_t h = 0; h < index_heads_; ++h) index_w.data<float>()[t * index_heads_ + h] *= weight_scale;
      }
    }
  }

  // Attention of each (token, head) over its sliding window and its visible compressed entries,
  // with the head's sink as one more logit that takes probability mass but has no value.
  Tensor attended = Tensor::empty(DType::F32, {tokens, heads_ * d});
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ctx.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<const float*> keys;
    std::vector<float> logits;
    for (int64_t t = begin; t < end; ++t) {
      if (!states[t]) continue;  // padding: zeros
      const int64_t p = batch.positions[t];
      keys.clear();
      for (int64_t j = std::max<int64_t>(0, p - window_ + 1); j <= p; ++j) keys.push_back(states[t]->kv.data() + j * d);
      if (compressor_) {
        const CompressorState& comp = states[t]->compressor;
        for (int64_t s : visible_entries(index_q.defined() ? index_q.data<float>() + t * index_heads_ * index_dim_ : nullptr,
                                         index_w.defined() ? index_w.data<float>() + t * index_heads_ : nullptr, p,
                                         indexer_ ? &states[t]->indexer : nullptr, comp.num_entries)) {
          keys.push_back(comp.entries.data() + s * d);
        }
      }
      auto rows = [&](auto&& fn) {
        for (std::size_t j = 0; j < keys.size(); ++j) fn(static_cast<int64_t>(j), keys[j], keys[j]);  // K = V
      };
      for (int64_t h = 0; h < heads_; ++h) {
        ops::softmax_attention_head(q.data<float>() + (t * heads_ + h) * d, d, scale, w_.sinks.data<float>() + h,
                                    static_cast<int64_t>(keys.size()), rows, logits,
                                    attended.data<float>() + (t * heads_ + h) * d);
      }
      // K = V carried rotary into the output: rotate back at the query's position.
      rotary_.apply(attended.data<float>() + t * heads_ * d, heads_, d, p, /*conjugate=*/true);
    }
  });

  // Grouped low-rank output: each group of heads to o_lora, then all groups to hidden.
  Tensor grouped = Tensor::empty(DType::F32, {tokens, groups_ * o_lora_});
  ops::grouped_projection(attended, w_.wo_a, groups_, grouped);
  ops::linear(ctx, grouped, w_.wo_b, nullptr, out);
}

}  // namespace r3::models
