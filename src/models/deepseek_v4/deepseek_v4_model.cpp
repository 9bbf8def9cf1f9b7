#include "models/deepseek_v4/deepseek_v4_model.h"

#include <cstring>

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

// Collapses each token's streams with `pre` into x [tokens, hidden].
void collapse(const std::vector<HyperConnection::Mix>& mixes, const Tensor& streams, int64_t hc, Tensor& x) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    float* out = x.data<float>() + t * hidden;
    std::fill(out, out + hidden, 0.0f);
    for (int64_t i = 0; i < hc; ++i) {
      const float pre = mixes[static_cast<std::size_t>(t)].pre[static_cast<std::size_t>(i)];
      const float* s = streams.data<float>() + (t * hc + i) * hidden;
      for (int64_t d = 0; d < hidden; ++d) out[d] += pre * s[d];
    }
  }
}

// stream[k] <- post[k] * sublayer_out + sum_j comb[j][k] * stream[j].
void expand(const std::vector<HyperConnection::Mix>& mixes, const Tensor& sublayer_out, int64_t hc, Tensor& streams) {
  const int64_t tokens = sublayer_out.dim(0), hidden = sublayer_out.dim(1);
  std::vector<float> mixed(static_cast<std::size_t>(hc * hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    const auto& m = mixes[static_cast<std::size_t>(t)];
    float* s = streams.data<float>() + t * hc * hidden;
    const float* y = sublayer_out.data<float>() + t * hidden;
    for (int64_t k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < hidden; ++d) {
        float v = m.post[static_cast<std::size_t>(k)] * y[d];
        for (int64_t j = 0; j < hc; ++j) v += m.comb[static_cast<std::size_t>(j * hc + k)] * s[j * hidden + d];
        mixed[static_cast<std::size_t>(k * hidden + d)] = v;
      }
    }
    std::copy(mixed.begin(), mixed.end(), s);
  }
}

std::vector<HyperConnection::Mix> mix_all(const HyperConnection& hc_module, const Tensor& streams, int64_t tokens,
                                          int64_t width) {
  std::vector<HyperConnection::Mix> mixes;
  for (int64_t t = 0; t < tokens; ++t) mixes.push_back(hc_module.mix(streams.data<float>() + t * width));
  return mixes;
}

}  // namespace

Tensor DeepseekV4Model::forward(ThreadPool& pool, const ForwardBatch& batch, ModelCache& model_cache) const {
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
    collapse(mixes, streams, hc, collapsed);
    ops::rms_norm(pool, collapsed, &layer.attn_norm, static_cast<float>(spec_.rms_norm_eps), x);
    layer.attention->forward(pool, x, batch, *cache, y);
    expand(mixes, y, hc, streams);

    mixes = mix_all(*layer.ffn_hc, streams, tokens, hc * hidden);
    collapse(mixes, streams, hc, collapsed);
    ops::rms_norm(pool, collapsed, &layer.ffn_norm, static_cast<float>(spec_.rms_norm_eps), x);
    const std::vector<int32_t> forced = batch.forced_for_layer(static_cast<int64_t>(l), moe_count, info_.top_k);
    layer.moe->forward(pool, {x, batch.token_ids, forced, batch.replayed, batch.capture, batch.loads, padding}, y);
    layer.shared_expert->forward(pool, x, shared);
    for (int64_t i = 0; i < tokens * hidden; ++i) y.data<float>()[i] += shared.data<float>()[i];
    expand(mixes, y, hc, streams);
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
  ops::rms_norm(pool, selected, &final_norm_, static_cast<float>(spec_.rms_norm_eps), selected);
  Tensor logits = Tensor::empty(DType::F32, {selected.dim(0), info_.vocab_size});
  ops::linear(pool, selected, lm_head_, nullptr, logits);
  return logits;
}

}  // namespace r3::models
