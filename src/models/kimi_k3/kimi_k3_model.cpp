#include "models/kimi_k3/kimi_k3_model.h"

#include <cstring>

#include "models/decoder_model.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

KimiK3Model::KimiK3Model(ModelInfo info, float rms_eps, int64_t block_size, Tensor embed,
                         std::vector<KimiK3Layer> layers, std::unique_ptr<AttentionResidual> output_mix,
                         Tensor final_norm, Tensor lm_head)
    : info_(std::move(info)),
      rms_eps_(rms_eps),
      block_size_(block_size),
      embed_(std::move(embed)),
      layers_(std::move(layers)),
      output_mix_(std::move(output_mix)),
      final_norm_(std::move(final_norm)),
      lm_head_(std::move(lm_head)) {
  R3_CHECK(block_size_ >= 1, "Kimi K3: attention-residual blocks of ", block_size_, " layers");
  for (const KimiK3Layer& layer : layers_) {
    cache_specs_.push_back(layer.attention->cache_spec());
    has_recurrent_layers_ = has_recurrent_layers_ || cache_specs_.back().kind == CacheSpec::Kind::kRecurrentState;
  }
}

std::unique_ptr<ModelCache> KimiK3Model::make_cache(int64_t max_seqs, int64_t capacity) const {
  return std::make_unique<KvCache>(cache_specs_, max_seqs, capacity, KvCacheOptions{});
}

std::unique_ptr<ModelCache> KimiK3Model::make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                                          int64_t block_size) const {
  return std::make_unique<KvCache>(cache_specs_, max_seqs, capacity, KvCacheOptions{block_size, 0, pool_blocks});
}

std::vector<moe::MoeBlock*> KimiK3Model::moe_blocks() {
  std::vector<moe::MoeBlock*> blocks;
  for (auto& layer : layers_) {
    if (moe::MoeBlock* b = layer.feed_forward->moe_block()) blocks.push_back(b);
  }
  return blocks;
}

void KimiK3Model::forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                               Tensor& logits) const {
  validate_batch(ctx.workspace(), batch, model_cache, info_);
  check_logits_shape(batch, info_, logits);
  KvCache& cache = model_kv_cache(model_cache, cache_specs_);
  check_kv_blocks(batch, cache);
  if (has_recurrent_layers_) check_runs_continue_states(batch, cache, ctx.workspace());
  const int64_t tokens = batch.size(), hidden = info_.hidden_size;
  const auto layer_count = static_cast<int64_t>(layers_.size());
  backend::Workspace::Scope step(ctx.workspace());
  // The block snapshots [blocks, tokens, hidden] and the running in-block sum h.
  const int64_t blocks = (layer_count + block_size_ - 1) / block_size_;
  Tensor snapshots = ctx.scratch(DType::F32, {blocks, tokens, hidden});
  int64_t taken = 0;
  Tensor h = ctx.scratch(DType::F32, {tokens, hidden});
  ops::embedding(ctx, embed_, batch.token_ids, h);
  Tensor mixed = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor normed = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor branch = ctx.scratch(DType::F32, {tokens, hidden});
  const std::size_t row_bytes = sizeof(float) * static_cast<std::size_t>(tokens * hidden);
  const auto moe_count = static_cast<int64_t>(info_.moe_layers.size());
  const std::span<const uint8_t> padding = batch.padding_mask(ctx.workspace());  // not counted in expert loads
  const ops::StepView view = batch.view();
  int64_t moe_index = 0;
  for (int64_t l = 0; l < layer_count; ++l) {
    const KimiK3Layer& layer = layers_[static_cast<std::size_t>(l)];
    backend::Workspace::Scope layer_scratch(ctx.workspace());
    const bool block_start = l % block_size_ == 0;
    if (taken > 0) {
      layer.pre_attention_mix->mix(ctx, snapshots, taken, h, mixed);
    } else {
      std::memcpy(mixed.data<float>(), h.data<float>(), row_bytes);
    }
    if (block_start) std::memcpy(snapshots.data<float>() + taken++ * tokens * hidden, h.data<float>(), row_bytes);
    ops::rms_norm(ctx, mixed, &layer.input_norm, rms_eps_, normed);
    layer.attention->forward(ctx, normed, view, cache, l, branch);
    if (!block_start) ops::add_rows(ctx, h, nullptr, branch);  // a block start's h is in the snapshots
    std::memcpy(h.data<float>(), branch.data<float>(), row_bytes);
    layer.post_attention_mix->mix(ctx, snapshots, taken, h, mixed);
    ops::rms_norm(ctx, mixed, &layer.post_attention_norm, rms_eps_, normed);
    std::span<const int32_t> forced;
    if (layer.feed_forward->moe_block() != nullptr) {
      forced = batch.forced_for_layer(ctx.workspace(), moe_index++, moe_count, info_.top_k);
    }
    layer.feed_forward->forward(
        ctx, {normed, batch.token_ids, forced, batch.replayed, batch.capture, batch.loads, padding,
                                     batch.dispatcher}, branch);
    ops::add_rows(ctx, branch, nullptr, h);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.seqs[t] != ForwardBatch::kPadding) cache.set_length(batch.seqs[t], batch.positions[t] + 1);
  }

  output_mix_->mix(ctx, snapshots, taken, h, mixed);
  Tensor selected = mixed;
  if (!batch.logit_rows.empty()) {
    selected = ctx.scratch(DType::F32, {static_cast<int64_t>(batch.logit_rows.size()), hidden});
    for (std::size_t i = 0; i < batch.logit_rows.size(); ++i) {
      std::memcpy(selected.data<float>() + static_cast<int64_t>(i) * hidden,
                  mixed.data<float>() + batch.logit_rows[i] * hidden, sizeof(float) * static_cast<std::size_t>(hidden));
    }
  }
  ops::rms_norm(ctx, selected, &final_norm_, rms_eps_, selected);
  ops::linear(ctx, selected, lm_head_, nullptr, logits);
}

}  // namespace r3::models
