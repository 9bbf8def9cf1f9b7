#include "models/deepseek_v4/v4_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

int64_t V4Attention::visible_entries(const float* index_q, const float* index_w, int64_t pos,
                                     const CompressorView* index, int64_t num_entries, const Scratch& scratch,
                                     int32_t* picked) const {
  const int64_t ready = std::min(num_entries, (pos + 1) / compressor_->rate());  // causal: complete windows
  if (kind_ != V4AttentionKind::kCompressed) {
    for (int64_t s = 0; s < ready; ++s) picked[s] = static_cast<int32_t>(s);
    return ready;
  }
  // Lightning indexer: score_s = sum_h w_h * relu(q_h . K_s) / sqrt(Di) over every entry the
  // cache holds, -inf for those not yet complete at this query; keep the top index_topk that
  // are complete. The selection follows PyTorch's CPU top-k, ties included (see topk.h), over
  // the same row the reference sees: all entries present when the step runs.
  const std::span<float> score = scratch.scores.mine().first(static_cast<std::size_t>(num_entries));
  std::fill(score.begin(), score.end(), -INFINITY);
  ops::lightning_index_scores(index_q, index_w, index->entries, ready, index_heads_, index_dim_, score.data());
  const int64_t k = std::min(index_topk_, num_entries);
  const std::span<int32_t> top = scratch.picked.mine().first(static_cast<std::size_t>(k));
  ops::torch_cpu_topk_set(score, k, scratch.topk.mine(), top);
  int64_t n = 0;  // compacts in place when top and picked share memory (n never passes the read index)
  for (int32_t s : top) {
    if (s < ready) picked[n++] = s;
  }
  std::sort(picked, picked + n);
  return n;
}

void V4Attention::forward(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch, V4Cache& cache,
                          Tensor& out) const {
  backend::Workspace::Scope scope(ctx.workspace());
  const int64_t tokens = x.dim(0), d = head_dim_;
  // Queries through the LoRA: latent RMSNorm, then an unweighted RMSNorm per head, then rotary.
  Tensor q_latent = ctx.scratch(DType::F32, {tokens, q_lora_});
  ops::linear(ctx, x, w_.wq_a, nullptr, q_latent);
  ops::rms_norm(ctx, q_latent, &w_.q_norm, rms_eps_, q_latent);
  Tensor q = ctx.scratch(DType::F32, {tokens, heads_ * d});
  ops::linear(ctx, q_latent, w_.wq_b, nullptr, q);
  Tensor q_heads = q.reshaped({tokens * heads_, d});
  ops::rms_norm(ctx, q_heads, nullptr, rms_eps_, q_heads);
  // The shared K=V row.
  Tensor kv = ctx.scratch(DType::F32, {tokens, d});
  ops::linear(ctx, x, w_.wkv, nullptr, kv);
  ops::rms_norm(ctx, kv, &w_.kv_norm, rms_eps_, kv);

  // A token reads the K=V rows of its sequence's earlier tokens in this step from `kv` (the cache
  // gets them after the attention, so its ring only has to cover the window before the step):
  // previous[t] is the row of the same sequence's previous position in this step, -1 if none.
  const std::span<int32_t> previous = ctx.workspace().array<int32_t>(tokens);
  const std::span<int32_t> last = ctx.workspace().array<int32_t>(cache.max_seqs());
  std::fill(last.begin(), last.end(), -1);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = batch.positions[t];
    rotary_.apply(q.data<float>() + t * heads_ * d, heads_, d, p);
    rotary_.apply(kv.data<float>() + t * d, 1, d, p);
    if (batch.seqs[t] == ForwardBatch::kPadding) continue;
    previous[t] = last[batch.seqs[t]];
    last[batch.seqs[t]] = static_cast<int32_t>(t);
  }

  // Compressed entries (and the indexer's) for every window completed by this step.
  Tensor index_q, index_w;
  int64_t max_entries = 0;  // the most entries any sequence of the step holds
  if (compressor_) {
    compressor_->update(ctx, x, batch, *cache.compressor(layer_));
    if (indexer_) indexer_->update(ctx, x, batch, *cache.indexer(layer_));
    for (int64_t t = 0; t < tokens; ++t) {
      if (batch.seqs[t] != ForwardBatch::kPadding) {
        max_entries = std::max(max_entries, cache.compressor(layer_)->num_entries(batch.seqs[t]));
      }
    }
    if (indexer_) {
      index_q = ctx.scratch(DType::F32, {tokens, index_heads_ * index_dim_});
      ops::linear(ctx, q_latent, w_.index_wq_b, nullptr, index_q);
      index_w = ctx.scratch(DType::F32, {tokens, index_heads_});
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
  Tensor attended = ctx.scratch(DType::F32, {tokens, heads_ * d});
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Scratch scratch{ctx.per_thread<const float*>(window_ + max_entries), ctx.per_thread<float>(max_entries),
                        ctx.per_thread<std::pair<double, int64_t>>(max_entries),
                        ctx.per_thread<int32_t>(max_entries)};
  const auto scores = ctx.per_thread<float>(window_ + max_entries);
  ctx.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    const std::span<float> logits = scores.mine();
    const std::span<const float*> keys = scratch.keys.mine();
    for (int64_t t = begin; t < end; ++t) {
      if (batch.seqs[t] == ForwardBatch::kPadding) continue;  // padding: zeros
      const int32_t seq = batch.seqs[t];
      const int64_t p = batch.positions[t], step_start = cache.length(seq);
      // The window [first, p] in position order: this step's rows, then the cached ones before them.
      const int64_t first = std::max<int64_t>(0, p - window_ + 1);
      int64_t n = p - first + 1, pos = p;
      for (int64_t row = t; pos >= std::max(first, step_start); --pos, row = previous[row]) {
        keys[pos - first] = kv.data<float>() + row * d;
      }
      const ops::PagedKv window = cache.window(layer_).view(seq);
      for (; pos >= first; --pos) keys[pos - first] = window.key_row(pos);
      if (compressor_) {
        const CompressorView comp = cache.compressor(layer_)->seq(seq);
        const CompressorView index = indexer_ ? cache.indexer(layer_)->seq(seq) : CompressorView{};
        int32_t* picked = scratch.picked.mine().data();
        const int64_t visible = visible_entries(
            index_q.defined() ? index_q.data<float>() + t * index_heads_ * index_dim_ : nullptr,
            index_w.defined() ? index_w.data<float>() + t * index_heads_ : nullptr, p, indexer_ ? &index : nullptr,
            *comp.num_entries, scratch, picked);
        for (int64_t i = 0; i < visible; ++i) keys[n++] = comp.entries.key_row(picked[i]);
      }
      auto runs = [&](auto&& fn) {
        for (int64_t j = 0; j < n; ++j) fn(j, 1, keys[j], keys[j], d);  // K = V, gathered row by row
      };
      for (int64_t h = 0; h < heads_; ++h) {
        ops::softmax_attention_head(q.data<float>() + (t * heads_ + h) * d, d, scale, w_.sinks.data<float>() + h, n,
                                    runs, logits, attended.data<float>() + (t * heads_ + h) * d);
      }
      // K = V carried rotary into the output: rotate back at the query's position.
      rotary_.apply(attended.data<float>() + t * heads_ * d, heads_, d, p, /*conjugate=*/true);
    }
  });

  // Now the step's K=V rows join the cache (in position order per sequence: the ring keeps the last).
  const auto row_bytes = sizeof(float) * static_cast<std::size_t>(d);
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.seqs[t] == ForwardBatch::kPadding) continue;
    std::memcpy(cache.window(layer_).view(batch.seqs[t]).key_row(batch.positions[t]), kv.data<float>() + t * d,
                row_bytes);
  }

  // Grouped low-rank output: each group of heads to o_lora, then all groups to hidden.
  Tensor grouped = ctx.scratch(DType::F32, {tokens, groups_ * o_lora_});
  ops::grouped_projection(attended, w_.wo_a, groups_, grouped);
  ops::linear(ctx, grouped, w_.wo_b, nullptr, out);
}

}  // namespace r3::models
