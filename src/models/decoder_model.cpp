#include "models/decoder_model.h"

#include <algorithm>
#include <cstring>

#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

KvCache& model_kv_cache(ModelCache& model_cache, const std::vector<CacheSpec>& specs) {
  auto* kv = dynamic_cast<KvCache*>(&model_cache);
  R3_CHECK(kv != nullptr && kv->num_layers() == static_cast<int64_t>(specs.size()),
           "forward: the cache was not made by this model");
  for (std::size_t l = 0; l < specs.size(); ++l) {
    R3_CHECK(kv->spec(static_cast<int64_t>(l)) == specs[l], "forward: the cache of layer ", l,
             " does not hold what the layer caches");
  }
  return *kv;
}

void check_kv_blocks(const ForwardBatch& batch, const KvCache& cache) {
  for (int64_t t = 0; t < batch.size(); ++t) {
    const int32_t seq = batch.seqs[static_cast<std::size_t>(t)];
    R3_CHECK(seq == ForwardBatch::kPadding || cache.covers(seq, batch.positions[static_cast<std::size_t>(t)]),
             "forward: position ", batch.positions[static_cast<std::size_t>(t)], " of sequence ", seq,
             " has no KV block (the engine must assign blocks before the step)");
  }
}

void check_runs_continue_states(const ForwardBatch& batch, const KvCache& kv, backend::Workspace& workspace) {
  backend::Workspace::Scope scope(workspace);
  const std::span<uint8_t> seen = workspace.array<uint8_t>(kv.max_seqs());
  std::fill(seen.begin(), seen.end(), 0);
  for (int64_t t = 0; t < batch.size(); ++t) {
    const int32_t seq = batch.seqs[static_cast<std::size_t>(t)];
    if (seq == ForwardBatch::kPadding) continue;
    const int32_t pos = batch.positions[static_cast<std::size_t>(t)];
    const bool continues = t > 0 && batch.seqs[static_cast<std::size_t>(t - 1)] == seq &&
                           batch.positions[static_cast<std::size_t>(t - 1)] + 1 == pos;
    if (continues) continue;
    R3_CHECK(seen[static_cast<std::size_t>(seq)] == 0 && pos == kv.length(seq), "KDA layers: sequence ", seq,
             "'s rows start at position ", pos, " but its state holds ", kv.length(seq),
             " positions (a sequence's rows of a step must be consecutive)");
    seen[static_cast<std::size_t>(seq)] = 1;
  }
}

DecoderModel::DecoderModel(ModelInfo info, float rms_eps, Tensor embed, std::vector<DecoderLayer> layers,
                           Tensor final_norm, Tensor lm_head)
    : info_(std::move(info)),
      rms_eps_(rms_eps),
      embed_(std::move(embed)),
      layers_(std::move(layers)),
      final_norm_(std::move(final_norm)),
      lm_head_(std::move(lm_head)) {
  for (const DecoderLayer& layer : layers_) {
    cache_specs_.push_back(layer.attention->cache_spec());
    has_recurrent_layers_ = has_recurrent_layers_ || cache_specs_.back().kind == CacheSpec::Kind::kRecurrentState;
  }
}

std::unique_ptr<ModelCache> DecoderModel::make_cache(int64_t max_seqs, int64_t capacity) const {
  return make_kv_cache(max_seqs, capacity, {});
}

std::unique_ptr<ModelCache> DecoderModel::make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                                           int64_t block_size) const {
  return make_kv_cache(max_seqs, capacity, {block_size, 0, pool_blocks});
}

std::unique_ptr<KvCache> DecoderModel::make_kv_cache(int64_t max_seqs, int64_t capacity,
                                                     KvCacheOptions options) const {
  return std::make_unique<KvCache>(cache_specs_, max_seqs, capacity, options);
}

std::vector<moe::MoeBlock*> DecoderModel::moe_blocks() {
  std::vector<moe::MoeBlock*> blocks;
  for (auto& layer : layers_) {
    if (moe::MoeBlock* b = layer.feed_forward->moe_block()) blocks.push_back(b);
  }
  return blocks;
}

void DecoderModel::forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                                Tensor& logits) const {
  validate_batch(ctx.workspace(), batch, model_cache, info_);
  check_logits_shape(batch, info_, logits);
  KvCache& cache = model_kv_cache(model_cache, cache_specs_);
  check_kv_blocks(batch, cache);
  if (has_recurrent_layers_) check_runs_continue_states(batch, cache, ctx.workspace());
  const int64_t tokens = batch.size(), hidden = info_.hidden_size;
  backend::Workspace::Scope step(ctx.workspace());
  Tensor residual = ctx.scratch(DType::F32, {tokens, hidden});
  ops::embedding(ctx, embed_, batch.token_ids, residual);
  Tensor normed = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor branch = ctx.scratch(DType::F32, {tokens, hidden});
  const auto moe_count = static_cast<int64_t>(info_.moe_layers.size());
  const std::span<const uint8_t> padding = batch.padding_mask(ctx.workspace());  // not counted in expert loads
  const ops::StepView view = batch.view();
  int64_t moe_index = 0;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& layer = layers_[l];
    backend::Workspace::Scope layer_scratch(ctx.workspace());
    ops::rms_norm(ctx, residual, &layer.input_norm, rms_eps_, normed);
    layer.attention->forward(ctx, normed, view, cache, static_cast<int64_t>(l), branch);
    ops::add_rows(ctx, branch, nullptr, residual);
    ops::rms_norm(ctx, residual, &layer.post_attention_norm, rms_eps_, normed);
    std::span<const int32_t> forced;
    if (layer.feed_forward->moe_block() != nullptr) {
      forced = batch.forced_for_layer(ctx.workspace(), moe_index++, moe_count, info_.top_k);
    }
    layer.feed_forward->forward(ctx, {normed, batch.token_ids, forced, batch.replayed, batch.capture, batch.loads, padding,
                                     batch.dispatcher}, branch);
    ops::add_rows(ctx, branch, nullptr, residual);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.seqs[t] != ForwardBatch::kPadding) cache.set_length(batch.seqs[t], batch.positions[t] + 1);
  }

  Tensor selected = residual;
  if (!batch.logit_rows.empty()) {
    selected = ctx.scratch(DType::F32, {static_cast<int64_t>(batch.logit_rows.size()), hidden});
    for (std::size_t i = 0; i < batch.logit_rows.size(); ++i) {
      std::memcpy(selected.data<float>() + static_cast<int64_t>(i) * hidden,
                  residual.data<float>() + batch.logit_rows[i] * hidden,
                  sizeof(float) * static_cast<std::size_t>(hidden));
    }
  }
  ops::rms_norm(ctx, selected, &final_norm_, rms_eps_, selected);
  ops::linear(ctx, selected, lm_head_, nullptr, logits);
}

}  // namespace r3::models
