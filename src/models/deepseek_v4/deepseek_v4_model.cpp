#include "models/deepseek_v4/deepseek_v4_model.h"

#include <cstring>

#include "ops/hyper_connection_mix.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

DeepseekV4Model::DeepseekV4Model(DeepseekV4Spec spec, ModelInfo info, Tensor embed, std::vector<V4Layer> layers,
                                 std::unique_ptr<HyperHead> head, Tensor final_norm, Tensor lm_head,
                                 std::unique_ptr<ops::TrailingInterleavedRotary> main_rotary,
                                 std::unique_ptr<ops::TrailingInterleavedRotary> compress_rotary)
    : spec_(std::move(spec)),
      info_(std::move(info)),
      embed_(std::move(embed)),
      layers_(std::move(layers)),
      head_(std::move(head)),
      final_norm_(std::move(final_norm)),
      lm_head_(std::move(lm_head)),
      main_rotary_(std::move(main_rotary)),
      compress_rotary_(std::move(compress_rotary)) {}

std::unique_ptr<ModelCache> DeepseekV4Model::make_cache(int64_t max_slots, int64_t capacity) const {
  return std::make_unique<V4Cache>(spec_, max_slots, capacity);
}

std::vector<moe::MoeBlock*> DeepseekV4Model::moe_blocks() {
  std::vector<moe::MoeBlock*> blocks;
  for (auto& layer : layers_) blocks.push_back(layer.moe.get());
  return blocks;
}

namespace {

// The mixing weights of every token, flattened for the ops: pre [tokens, hc], post [tokens, hc],
// comb [tokens, hc, hc].
struct Mixes {
  std::vector<float> pre, post, comb;
};

Mixes mix_all(const HyperConnection& hc_module, const Tensor& streams, int64_t tokens, int64_t width) {
  Mixes all;
  for (int64_t t = 0; t < tokens; ++t) {
    const HyperConnection::Mix m = hc_module.mix(streams.data<float>() + t * width);
    all.pre.insert(all.pre.end(), m.pre.begin(), m.pre.end());
    all.post.insert(all.post.end(), m.post.begin(), m.post.end());
    all.comb.insert(all.comb.end(), m.comb.begin(), m.comb.end());
  }
  return all;
}

}  // namespace

Tensor DeepseekV4Model::forward(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache) const {
  validate_batch(batch, model_cache, info_);
  auto* cache = dynamic_cast<V4Cache*>(&model_cache);
  R3_CHECK(cache != nullptr, "forward: the cache was not made by this model");
  const int64_t tokens = batch.size(), hidden = spec_.hidden_size, hc = spec_.hc_mult;

  Tensor streams = Tensor::empty(DType::F32, {tokens, hc, hidden});
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < hc; ++i) {
      std::memcpy(streams.data<float>() + (t * hc + i) * hidden, embed_.data<float>() + batch.token_ids[t] * hidden,
                  sizeof(float) * static_cast<std::size_t>(hidden));
    }
  }
  Tensor collapsed = Tensor::empty(DType::F32, {tokens, hidden});
  Tensor x = Tensor::empty(DType::F32, {tokens, hidden});
  Tensor y = Tensor::empty(DType::F32, {tokens, hidden});
  Tensor shared = Tensor::empty(DType::F32, {tokens, hidden});
  const auto moe_count = static_cast<int64_t>(layers_.size());
  const std::vector<uint8_t> padding = batch.padding_mask();  // not counted in expert loads
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const V4Layer& layer = layers_[l];
    auto mixes = mix_all(*layer.attn_hc, streams, tokens, hc * hidden);
    ops::hc_collapse(streams, mixes.pre.data(), collapsed);
    ops::rms_norm(ctx, collapsed, &layer.attn_norm, static_cast<float>(spec_.rms_norm_eps), x);
    layer.attention->forward(ctx, x, batch, *cache, y);
    ops::hc_expand(mixes.post.data(), mixes.comb.data(), y, streams);

    mixes = mix_all(*layer.ffn_hc, streams, tokens, hc * hidden);
    ops::hc_collapse(streams, mixes.pre.data(), collapsed);
    ops::rms_norm(ctx, collapsed, &layer.ffn_norm, static_cast<float>(spec_.rms_norm_eps), x);
    const std::vector<int32_t> forced = batch.forced_for_layer(static_cast<int64_t>(l), moe_count, info_.top_k);
    layer.moe->forward(ctx, {x, batch.token_ids, forced, batch.replayed, batch.capture, batch.loads, padding}, y);
    layer.shared_expert->forward(ctx, x, shared);
    for (int64_t i = 0; i < tokens * hidden; ++i) y.data<float>()[i] += shared.data<float>()[i];
    ops::hc_expand(mixes.post.data(), mixes.comb.data(), y, streams);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.slots[t] != ForwardBatch::kPadding) cache->set_length(batch.slots[t], batch.positions[t] + 1);
  }

  std::vector<int64_t> rows = batch.logit_rows;
  if (rows.empty()) {
    for (int64_t t = 0; t < tokens; ++t) rows.push_back(t);
  }
  Tensor selected = Tensor::empty(DType::F32, {static_cast<int64_t>(rows.size()), hidden});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    head_->collapse(streams.data<float>() + rows[i] * hc * hidden, hidden,
                    selected.data<float>() + static_cast<int64_t>(i) * hidden);
  }
  ops::rms_norm(ctx, selected, &final_norm_, static_cast<float>(spec_.rms_norm_eps), selected);
  Tensor logits = Tensor::empty(DType::F32, {selected.dim(0), info_.vocab_size});
  ops::linear(ctx, selected, lm_head_, nullptr, logits);
  return logits;
}

}  // namespace r3::models
