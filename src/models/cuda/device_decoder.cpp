// The decoder on a CUDA device (models/device_decoder.h): the step of DecoderModel::forward_into
// over the device layers (models/cuda/device_layers.cpp), and placing a loaded model there.
#include "models/device_decoder.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "models/cuda/device_decoder_parts.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

namespace device {

Decoder::Decoder(backend::Context& ctx, DecoderParts parts) : ctx_(ctx), p_(std::move(parts)) {
  R3_CHECK(ctx.device() == Device::kCuda, "a device decoder needs a CUDA context");
}

std::unique_ptr<ModelCache> Decoder::make_cache(int64_t max_seqs, int64_t capacity) const {
  KvCacheOptions options;
  options.device = &ctx_;
  return std::make_unique<KvCache>(p_.cache_specs, max_seqs, capacity, options);
}

std::unique_ptr<ModelCache> Decoder::make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                                      int64_t block_size) const {
  KvCacheOptions options;
  options.block_size = block_size;
  options.pool_blocks = pool_blocks;
  options.device = &ctx_;
  return std::make_unique<KvCache>(p_.cache_specs, max_seqs, capacity, options);
}

std::vector<moe::MoeBlock*> Decoder::moe_blocks() {
  return p_.host ? p_.host->moe_blocks() : std::vector<moe::MoeBlock*>{};
}

void Decoder::forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                           Tensor& logits) const {
  R3_CHECK(&ctx == &ctx_, "forward: a device model runs on the context it was placed with");
  const ModelInfo& info = p_.info;
  validate_batch(ctx.workspace(), batch, model_cache, info);
  check_logits_shape(batch, info, logits);
  auto* kv = dynamic_cast<KvCache*>(&model_cache);
  R3_CHECK(kv != nullptr && kv->on_device() && kv->num_layers() == static_cast<int64_t>(p_.layers.size()),
           "forward: the cache was not made by this device model");
  for (int64_t t = 0; t < batch.size(); ++t) {
    const int32_t seq = batch.seqs[static_cast<std::size_t>(t)];
    R3_CHECK(seq == ForwardBatch::kPadding || kv->covers(seq, batch.positions[static_cast<std::size_t>(t)]),
             "forward: position ", batch.positions[static_cast<std::size_t>(t)], " of sequence ", seq,
             " has no KV block (the engine must assign blocks before the step)");
  }
  const int64_t tokens = batch.size(), hidden = info.hidden_size;
  prepare(tokens, *kv);
  backend::Workspace::Scope step_scope(ctx.workspace());
  const std::span<std::span<const int32_t>> tables = ctx.workspace().array<std::span<const int32_t>>(kv->max_seqs());
  for (int64_t s = 0; s < kv->max_seqs(); ++s) tables[static_cast<std::size_t>(s)] = kv->block_table(0, s);
  const ops::DeviceStep step = steps_->build(batch.token_ids, batch.positions, batch.seqs, tables, batch.logit_rows,
                                             {batch.forced_routing, batch.replayed});

  Tensor residual = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor normed = ctx.scratch(DType::F32, {tokens, hidden});
  Tensor branch = ctx.scratch(DType::F32, {tokens, hidden});
  ops::cuda::embedding_ids_on_device(ctx, p_.embed, step.token_ids, tokens, residual);
  if (capture_) capture_->begin_step();
  for (std::size_t l = 0; l < p_.layers.size(); ++l) {
    const Layer& layer = p_.layers[l];
    ops::rms_norm(ctx, residual, &layer.input_norm, p_.rms_eps, normed);
    layer.attention->forward(ctx, normed, step, kv->device_pool(static_cast<int64_t>(l)), branch);
    ops::add_rows(ctx, branch, nullptr, residual);
    ops::rms_norm(ctx, residual, &layer.post_attention_norm, p_.rms_eps, normed);
    if (layer.moe) layer.moe->forward(ctx, normed, step, *capture_, branch);
    else layer.dense->forward(ctx, normed, branch);
    ops::add_rows(ctx, branch, nullptr, residual);
  }
  if (capture_) capture_->end_step(tokens);

  Tensor selected = ctx.scratch(DType::F32, {step.logit_row_count, hidden});
  ops::cuda::embedding_ids_on_device(ctx, residual, step.logit_rows, step.logit_row_count, selected);
  ops::rms_norm(ctx, selected, &p_.final_norm, p_.rms_eps, selected);
  Tensor device_logits = ctx.scratch(DType::F32, {step.logit_row_count, info.vocab_size});
  ops::linear(ctx, selected, p_.lm_head, nullptr, device_logits);
  backend::copy_to_host(ctx, device_logits, logits);  // the step's one wait

  if (capture_) deliver_routing(ctx, batch);
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.seqs[t] != ForwardBatch::kPadding) kv->set_length(batch.seqs[t], batch.positions[t] + 1);
  }
}

void Decoder::prepare(int64_t tokens, const KvCache& kv) const {
  const int64_t table_blocks = (kv.capacity() + kv.block_size() - 1) / kv.block_size();
  const auto moe_layers = static_cast<int64_t>(p_.info.moe_layers.size());
  if (!steps_ || tokens > step_room_ || kv.max_seqs() > slot_room_ || table_blocks > table_room_) {
    step_room_ = std::max(step_room_, tokens);
    slot_room_ = std::max(slot_room_, kv.max_seqs());
    table_room_ = std::max(table_room_, table_blocks);
    steps_ = std::make_unique<DeviceStepBuilder>(ctx_, step_room_, slot_room_, table_room_, moe_layers, p_.info.top_k);
  }
  if (moe_layers > 0 && (!capture_ || tokens > capture_room_)) {
    capture_room_ = std::max(capture_room_, tokens);
    capture_ = std::make_unique<moe::DeviceCaptureBuffer>(ctx_, capture_room_, moe_layers, p_.info.top_k);
  }
}

void Decoder::deliver_routing(backend::Context& ctx, const ForwardBatch& batch) const {
  const int64_t tokens = batch.size(), k = p_.info.top_k;
  const auto moe_layers = static_cast<int64_t>(p_.info.moe_layers.size());
  const std::span<const int32_t> rows = capture_->collect();             // [tokens, layers, k]
  const std::span<const float> weights = capture_->collected_weights();  // [layers, tokens, k]
  R3_CHECK(batch.capture != nullptr, "forward: MoE layers need the step's capture buffer");
  backend::Workspace::Scope scope(ctx.workspace());
  const std::span<int32_t> layer_ids = ctx.workspace().array<int32_t>(tokens * k);
  for (int64_t j = 0; j < moe_layers; ++j) {
    for (int64_t t = 0; t < tokens; ++t) std::copy_n(rows.data() + (t * moe_layers + j) * k, k, layer_ids.data() + t * k);
    batch.capture->record(j, layer_ids, weights.subspan(static_cast<std::size_t>(j * tokens * k),
                                                        static_cast<std::size_t>(tokens * k)));
    if (batch.loads == nullptr) continue;
    const std::span<int64_t> counts = batch.loads->layer(j);  // physical = logical: no replicas on the GPU
    for (int64_t t = 0; t < tokens; ++t) {
      if (batch.seqs[t] == ForwardBatch::kPadding) continue;
      for (int64_t c = 0; c < k; ++c) ++counts[static_cast<std::size_t>(layer_ids[t * k + c])];
    }
  }
}

}  // namespace device

std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model, DType weights) {
  auto* decoder = dynamic_cast<DecoderModel*>(model.get());
  R3_CHECK(decoder != nullptr, "--device cuda: ", model->info().architecture,
           " has no CUDA kernels yet (DeepSeek-V4's compressed attention comes in a later release); use --device cpu");
  model.release();
  std::unique_ptr<DecoderModel> host(decoder);
  R3_CHECK(ctx.device() == Device::kCuda, "place_on_device: not a CUDA context");
  R3_CHECK(weights == DType::F32 || weights == DType::BF16, "--dtype: float32 or bfloat16 weights on the GPU, not ",
           dtype_name(weights));
  R3_CHECK(!host->eplb_options().active(),
           "--device cuda: EPLB (replicas, load windows, rebalancing) on the GPU is not supported yet");
  device::DecoderParts parts;
  parts.info = host->info();
  parts.rms_eps = host->rms_eps();
  parts.cache_specs = host->cache_specs();
  parts.embed = device::on_device(ctx, host->embed(), weights);  // the lookup widens it exactly
  parts.final_norm = device::on_device(ctx, host->final_norm(), DType::F32);
  const bool tied = host->lm_head().raw_data() == host->embed().raw_data();
  parts.lm_head = tied ? parts.embed : device::on_device(ctx, host->lm_head(), weights);
  for (std::size_t l = 0; l < host->layers().size(); ++l) {
    const DecoderLayer& layer = host->layers()[l];
    device::Layer d;
    d.input_norm = device::on_device(ctx, layer.input_norm, DType::F32);
    d.post_attention_norm = device::on_device(ctx, layer.post_attention_norm, DType::F32);
    const auto* gqa = dynamic_cast<const GqaAttention*>(layer.attention.get());
    R3_CHECK(gqa != nullptr, "--device cuda: layer ", l,
             " uses multi-head latent attention, which has no CUDA kernels yet (DeepSeek-V2/V3, Kimi K2)");
    d.attention.emplace(ctx, *gqa, weights);
    if (const auto* dense = dynamic_cast<const DenseFeedForward*>(layer.feed_forward.get())) {
      d.dense.emplace(device::mlp_on_device(ctx, dense->mlp(), weights));
    } else {
      const auto* moe = dynamic_cast<const MoeFeedForward*>(layer.feed_forward.get());
      R3_CHECK(moe != nullptr, "--device cuda: layer ", l, "'s feed-forward has no CUDA kernels");
      d.moe.emplace(ctx, *moe, weights);
    }
    parts.layers.push_back(std::move(d));
  }
  parts.host = std::move(host);
  return std::make_unique<device::Decoder>(ctx, std::move(parts));
}

}  // namespace r3::models
