#include "models/deepseek_v4/deepseek_v4_model.h"

#include <cstring>
#include <span>

#include "ops/elementwise.h"
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

std::unique_ptr<ModelCache> DeepseekV4Model::make_cache(int64_t max_seqs, int64_t capacity) const {
  return make_v4_cache(max_seqs, capacity, {});
}

std::unique_ptr<V4Cache> DeepseekV4Model::make_v4_cache(int64_t max_seqs, int64_t capacity,
                                                        V4CacheOptions options) const {
  return std::make_unique<V4Cache>(spec_, max_seqs, capacity, options);
}

std::vector<moe::MoeBlock*> DeepseekV4Model::moe_blocks() {
  std::vector<moe::MoeBlock*> blocks;
  for (auto& layer : layers_) blocks.push_back(layer.moe.get());
  return blocks;
}

namespace {

// The mixing weights of every token, flattened for the ops: pre [tokens, hc], post [tokens, hc],
// comb [tokens, hc, hc]; taken from the workspace (valid until the caller's scope ends).
struct Mixes {
  std::span<float> pre, post, comb;
};

Mixes mix_all(backend::Context& ctx, const HyperConnection& hc_module, const Tensor& streams) {
  const int64_t tokens = streams.dim(0), hc = streams.dim(1), width = hc * streams.dim(2);
  backend::Workspace& ws = ctx.workspace();
  const Mixes all{ws.array<float>(tokens * hc), ws.array<float>(tokens * hc), ws.array<float>(tokens * hc * hc)};
  const auto scratch = ctx.per_thread<float>(hc_module.scratch_size());
  ctx.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      hc_module.mix(streams.data<float>() + t * width, scratch.mine(), all.pre.data() + t * hc,
                    all.post.data() + t * hc, all.comb.data() + t * hc * hc);
    }
  });
  return all;
}

}  // namespace

void DeepseekV4Model::forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                                   Tensor& logits) const {
  validate_batch(ctx.workspace(), batch, model_cache, info_);
  check_logits_shape(batch, info_, logits);
  auto* cache = dynamic_cast<V4Cache*>(&model_cache);
  R3_CHECK(cache != nullptr, "forward: the cache was not made by this model");
  backend::Workspace::Scope scope(ctx.workspace());
  backend::Workspace& ws = ctx.workspace();
  const int64_t tokens = batch.size(), hidden = spec_.hidden_size, hc = spec_.hc_mult;

  Tensor streams = ctx.scratch(DType::F32, {tokens, hc, hidden});
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < hc; ++i) {
      std::memcpy(streams.data<float>() + (t * hc + i) * hidden, embed_.data<float>() + batch.token_ids[t] * hidden,
                  sizeof(float) * static_cast<std::size_t>(hidden));
    }
  }
  Tensor collapsed = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor x = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor y = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor shared = ctx.scratch(DType::F32, {tokens, hidden});
  const auto moe_count = static_cast<int64_t>(layers_.size());
  const std::span<const uint8_t> padding = batch.padding_mask(ws);  // not counted in expert loads
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const V4Layer& layer = layers_[l];
    backend::Workspace::Scope layer_scope(ws);
    Mixes mixes = mix_all(ctx, *layer.attn_hc, streams);
    ops::hc_collapse(streams, mixes.pre.data(), collapsed);
    ops::rms_norm(ctx, collapsed, &layer.attn_norm, static_cast<float>(spec_.rms_norm_eps), x);
    layer.attention->forward(ctx, x, batch, *cache, y);
    ops::hc_expand(ctx, mixes.post.data(), mixes.comb.data(), y, streams);

    mixes = mix_all(ctx, *layer.ffn_hc, streams);
    ops::hc_collapse(streams, mixes.pre.data(), collapsed);
    ops::rms_norm(ctx, collapsed, &layer.ffn_norm, static_cast<float>(spec_.rms_norm_eps), x);
    const std::span<const int32_t> forced = batch.forced_for_layer(ws, static_cast<int64_t>(l), moe_count, info_.top_k);
    layer.moe->forward(ctx, {x, batch.token_ids, forced, batch.replayed, batch.capture, batch.loads, padding,
                                     batch.dispatcher}, y);
    layer.shared_expert->forward(ctx, x, shared);
    ops::add_rows(ctx, shared, nullptr, y);
    ops::hc_expand(ctx, mixes.post.data(), mixes.comb.data(), y, streams);
  }
  // Each sequence's new length, set once: setting every intermediate length would drop (and force
  // re-emitting) compressed entries whose windows' projections the cache no longer holds.
  for (int64_t t = tokens - 1; t >= 0; --t) {
    const int32_t seq = batch.seqs[t];
    if (seq != ForwardBatch::kPadding && batch.positions[t] + 1 > cache->length(seq)) {
      cache->set_length(seq, batch.positions[t] + 1);
    }
  }

  // The rows whose logits the step returns: batch.logit_rows, or every row.
  const auto row_count = static_cast<int64_t>(batch.logit_rows.empty() ? tokens : batch.logit_rows.size());
  auto row = [&](int64_t i) { return batch.logit_rows.empty() ? i : batch.logit_rows[static_cast<std::size_t>(i)]; };
  Tensor selected = ctx.scratch(DType::F32, {row_count, hidden});
  const std::span<float> head_scratch = ws.array<float>(hc * hidden);
  for (int64_t i = 0; i < row_count; ++i) {
    head_->collapse(streams.data<float>() + row(i) * hc * hidden, hidden, head_scratch,
                    selected.data<float>() + i * hidden);
  }
  ops::rms_norm(ctx, selected, &final_norm_, static_cast<float>(spec_.rms_norm_eps), selected);
  ops::linear(ctx, selected, lm_head_, nullptr, logits);
}

}  // namespace r3::models
