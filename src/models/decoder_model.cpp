#include "models/decoder_model.h"

#include <cstring>
#include <map>

#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

DecoderModel::DecoderModel(ModelInfo info, float rms_eps, int64_t kv_width, Tensor embed,
                           std::vector<DecoderLayer> layers, Tensor final_norm, Tensor lm_head)
    : info_(std::move(info)),
      rms_eps_(rms_eps),
      kv_width_(kv_width),
      embed_(std::move(embed)),
      layers_(std::move(layers)),
      final_norm_(std::move(final_norm)),
      lm_head_(std::move(lm_head)) {}

KvCache DecoderModel::make_kv_cache(int64_t max_slots, int64_t capacity) const {
  return KvCache(info_.num_layers, kv_width_, kv_width_, max_slots, capacity);
}

void DecoderModel::validate(const ForwardBatch& batch, const KvCache& cache) const {
  const auto n = static_cast<std::size_t>(batch.size());
  R3_CHECK(n > 0, "forward: empty batch");
  R3_CHECK(batch.positions.size() == n && batch.slots.size() == n,
           "forward: token_ids, positions and slots must have the same length");
  // Each slot's tokens must continue its cached prefix without gaps.
  std::map<int32_t, int64_t> next;
  for (std::size_t t = 0; t < n; ++t) {
    const int32_t id = batch.token_ids[t];
    R3_CHECK(id >= 0 && id < info_.vocab_size, "token id ", id, " is outside the vocabulary [0, ",
             info_.vocab_size, ")");
    const int32_t slot = batch.slots[t];
    if (slot == ForwardBatch::kPadding) continue;
    R3_CHECK(slot >= 0 && slot < cache.max_slots(), "forward: slot ", slot, " out of range");
    auto [it, fresh] = next.try_emplace(slot, cache.length(slot));
    R3_CHECK(batch.positions[t] == it->second, "forward: slot ", slot, " expects position ",
             it->second, ", got ", batch.positions[t]);
    R3_CHECK(batch.positions[t] < cache.capacity(), "sequence of ", batch.positions[t] + 1,
             " tokens exceeds the KV cache capacity of ", cache.capacity());
    ++it->second;
  }
  const auto per_token = static_cast<std::size_t>(info_.moe_layers.size() * info_.top_k);
  R3_CHECK(batch.forced_routing.empty() || batch.forced_routing.size() == n * per_token,
           "replayed routing has ", batch.forced_routing.size(), " ids for ", n, " tokens x ",
           info_.moe_layers.size(), " MoE layers x top-", info_.top_k);
  for (int64_t row : batch.logit_rows) {
    R3_CHECK(row >= 0 && row < batch.size(), "forward: logit row ", row, " out of range");
  }
}

std::vector<moe::MoeBlock*> DecoderModel::moe_blocks() {
  std::vector<moe::MoeBlock*> blocks;
  for (auto& layer : layers_) {
    if (moe::MoeBlock* b = layer.feed_forward->moe_block()) blocks.push_back(b);
  }
  return blocks;
}

void DecoderModel::end_step() {
  if (eplb_) eplb_->end_step();
}

namespace {

// Column j of a [tokens, layers, k] routing: the [tokens, k] ids of MoE layer j.
std::vector<int32_t> layer_routing(const std::vector<int32_t>& forced, int64_t tokens, int64_t layers,
                                   int64_t k, int64_t j) {
  std::vector<int32_t> out;
  if (forced.empty()) return out;
  out.reserve(static_cast<std::size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t) {
    const auto first = forced.begin() + (t * layers + j) * k;
    out.insert(out.end(), first, first + k);
  }
  return out;
}

}  // namespace

Tensor DecoderModel::forward(ThreadPool& pool, const ForwardBatch& batch, KvCache& cache) const {
  validate(batch, cache);
  const int64_t tokens = batch.size(), hidden = info_.hidden_size;
  Tensor residual = Tensor::empty(DType::F32, {tokens, hidden});
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(residual.data<float>() + t * hidden, embed_.data<float>() + batch.token_ids[t] * hidden,
                sizeof(float) * static_cast<std::size_t>(hidden));
  }
  Tensor normed = Tensor::empty(DType::F32, {tokens, hidden});
  Tensor branch = Tensor::empty(DType::F32, {tokens, hidden});
  auto add_branch = [&] {
    float* r = residual.data<float>();
    const float* b = branch.data<float>();
    for (int64_t i = 0; i < tokens * hidden; ++i) r[i] += b[i];
  };
  const auto moe_count = static_cast<int64_t>(info_.moe_layers.size());
  int64_t moe_index = 0;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& layer = layers_[l];
    ops::rms_norm(pool, residual, &layer.input_norm, rms_eps_, normed);
    layer.attention->forward(pool, normed, batch, cache, static_cast<int64_t>(l), branch);
    add_branch();
    ops::rms_norm(pool, residual, &layer.post_attention_norm, rms_eps_, normed);
    std::vector<int32_t> forced;
    if (layer.feed_forward->moe_block() != nullptr) {
      forced = layer_routing(batch.forced_routing, tokens, moe_count, info_.top_k, moe_index++);
    }
    layer.feed_forward->forward(pool, normed, forced, branch);
    add_branch();
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.slots[t] != ForwardBatch::kPadding) cache.set_length(batch.slots[t], batch.positions[t] + 1);
  }

  Tensor selected = residual;
  if (!batch.logit_rows.empty()) {
    selected = Tensor::empty(DType::F32, {static_cast<int64_t>(batch.logit_rows.size()), hidden});
    for (std::size_t i = 0; i < batch.logit_rows.size(); ++i) {
      std::memcpy(selected.data<float>() + static_cast<int64_t>(i) * hidden,
                  residual.data<float>() + batch.logit_rows[i] * hidden,
                  sizeof(float) * static_cast<std::size_t>(hidden));
    }
  }
  ops::rms_norm(pool, selected, &final_norm_, rms_eps_, selected);
  Tensor logits = Tensor::empty(DType::F32, {selected.dim(0), info_.vocab_size});
  ops::linear(pool, selected, lm_head_, nullptr, logits);
  return logits;
}

}  // namespace r3::models
