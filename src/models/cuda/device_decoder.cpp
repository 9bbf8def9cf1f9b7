// DecoderModel's step on a CUDA device (models/device_decoder.h). The layer loop is the host
// model's (DecoderModel::forward_into, GqaAttention::forward, MoeFeedForward::forward), with each
// piece replaced by its device kernel and the per-token metadata read from the step's one upload.
#include "models/device_decoder.h"

#include <cmath>
#include <optional>
#include <vector>

#include "backend/device_memory.h"
#include "models/decoder_model.h"
#include "models/device_step_builder.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/kv_write.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rotary.h"
#include "moe/device_capture.h"
#include "moe/device_experts.h"
#include "moe/device_routing.h"

namespace r3::models {

namespace {

// A host weight in device memory as `dtype`, or an undefined tensor for an absent optional weight.
Tensor on_device(backend::Context& ctx, const Tensor& host, DType dtype) {
  return host.defined() ? backend::to_device_as(ctx, host, dtype) : Tensor();
}
// Norms, biases, sinks, gates: always float32.
Tensor f32_on_device(backend::Context& ctx, const Tensor& host) { return on_device(ctx, host, DType::F32); }

struct DeviceMlp {
  Tensor gate, up, down;
  float limit = INFINITY;

  DeviceMlp(backend::Context& ctx, const SwigluMlp& mlp, DType dtype)
      : gate(on_device(ctx, mlp.gate(), dtype)),
        up(on_device(ctx, mlp.up(), dtype)),
        down(on_device(ctx, mlp.down(), dtype)),
        limit(mlp.limit()) {}

  void forward(backend::Context& ctx, const Tensor& x, Tensor& out) const {
    const int64_t tokens = x.dim(0), width = gate.dim(0);
    backend::Workspace::Scope scope(ctx.workspace());
    Tensor g = ctx.scratch(DType::F32, {tokens, width});
    Tensor u = ctx.scratch(DType::F32, {tokens, width});
    ops::linear(ctx, x, gate, nullptr, g);
    ops::linear(ctx, x, up, nullptr, u);
    ops::silu_and_mul(ctx, g, u, g, limit);
    ops::linear(ctx, g, down, nullptr, out);
  }
};

struct DeviceAttention {
  AttentionSpec spec;
  float rms_eps;
  const ops::Rotary& rotary;  // the host layer's frequencies (passed to the kernel by value)
  int64_t sliding_window;
  Tensor q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm, sinks;

  DeviceAttention(backend::Context& ctx, const GqaAttention& host, DType dtype)
      : spec(host.spec()), rms_eps(host.rms_eps()), rotary(host.rotary()), sliding_window(host.sliding_window()) {
    const GqaAttentionWeights& w = host.weights();
    q = on_device(ctx, w.q, dtype);
    k = on_device(ctx, w.k, dtype);
    v = on_device(ctx, w.v, dtype);
    o = on_device(ctx, w.o, dtype);
    q_bias = f32_on_device(ctx, w.q_bias);
    k_bias = f32_on_device(ctx, w.k_bias);
    v_bias = f32_on_device(ctx, w.v_bias);
    o_bias = f32_on_device(ctx, w.o_bias);
    q_norm = f32_on_device(ctx, w.q_norm);
    k_norm = f32_on_device(ctx, w.k_norm);
    sinks = f32_on_device(ctx, w.sinks);
  }

  void normalise_qk(backend::Context& ctx, Tensor& qt, Tensor& kt) const {
    const int64_t tokens = qt.dim(0), d = spec.head_dim;
    if (spec.qk_norm == QkNorm::kFull) {
      ops::rms_norm(ctx, qt, &q_norm, rms_eps, qt);
      ops::rms_norm(ctx, kt, &k_norm, rms_eps, kt);
    } else if (spec.qk_norm == QkNorm::kPerHead) {
      Tensor qh = qt.reshaped({tokens * spec.num_heads, d});
      Tensor kh = kt.reshaped({tokens * spec.num_kv_heads, d});
      ops::rms_norm(ctx, qh, &q_norm, rms_eps, qh);
      ops::rms_norm(ctx, kh, &k_norm, rms_eps, kh);
    }
  }

  // Every row's keys and values are written before any token reads the pool, so a step may
  // bring any number of a sequence's positions (the device pools keep every position).
  void forward(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step, const ops::DeviceKvPool& pool,
               Tensor& out) const {
    const int64_t tokens = x.dim(0), d = spec.head_dim;
    const int64_t q_width = spec.num_heads * d, kv_width = spec.num_kv_heads * d;
    backend::Workspace::Scope scope(ctx.workspace());
    Tensor qt = ctx.scratch(DType::F32, {tokens, q_width});
    Tensor kt = ctx.scratch(DType::F32, {tokens, kv_width});
    Tensor vt = ctx.scratch(DType::F32, {tokens, kv_width});
    ops::linear(ctx, x, q, q_bias.if_defined(), qt);
    ops::linear(ctx, x, k, k_bias.if_defined(), kt);
    ops::linear(ctx, x, v, v_bias.if_defined(), vt);
    normalise_qk(ctx, qt, kt);
    if (spec.clip_qkv > 0) {
      for (Tensor* t : {&qt, &kt, &vt}) ops::clamp(ctx, *t, static_cast<float>(spec.clip_qkv));
    }
    Tensor qh = qt.reshaped({tokens, spec.num_heads, d});
    Tensor kh = kt.reshaped({tokens, spec.num_kv_heads, d});
    ops::cuda::rotary_positions_on_device(ctx, rotary, qh, step.positions);
    ops::cuda::rotary_positions_on_device(ctx, rotary, kh, step.positions);
    ops::cuda::write_kv_paged(ctx, kt.data<float>(), kv_width, vt.data<float>(), kv_width, step, pool);
    Tensor attended = ctx.scratch(DType::F32, {tokens, spec.num_heads, d});
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    ops::cuda::paged_attention(ctx, qh, step, pool, spec.num_kv_heads, scale, sliding_window,
                               sinks.defined() ? sinks.data<float>() : nullptr, attended);
    ops::linear(ctx, attended.reshaped({tokens, q_width}), o, o_bias.if_defined(), out);
  }
};

struct DeviceMoe {
  int64_t layer_id;
  int64_t num_experts, top_k;
  Tensor gate_weight, gate_bias, correction_bias;
  moe::DeviceRoutingRule rule;
  moe::DeviceExperts experts;
  std::optional<DeviceMlp> shared_expert;
  Tensor shared_gate;

  DeviceMoe(backend::Context& ctx, const MoeFeedForward& host, DType dtype) : layer_id(host.moe().layer_id()) {
    const moe::MoeBlock& block = host.moe();
    const moe::PhysicalExperts& physical = block.experts();
    R3_CHECK(physical.num_physical() == physical.num_logical(), "--device cuda: MoE layer ", layer_id, " has ",
             physical.num_physical() - physical.num_logical(),
             " redundant expert replicas; EPLB on the GPU is not supported yet");
    const moe::MoeBlock::Gate gate = block.gate();
    num_experts = gate.weight.dim(0);
    top_k = gate.rule.top_k();
    R3_CHECK(num_experts <= moe::kMaxDeviceExperts, "--device cuda: MoE layer ", layer_id, " has ", num_experts,
             " experts; the routing kernel takes at most ", moe::kMaxDeviceExperts);
    moe::DeviceRuleDescription described = moe::describe_for_device(gate.rule);
    rule = described.rule;
    if (!described.bias.empty()) {
      correction_bias = backend::to_device(
          ctx, Tensor::from(described.bias, {static_cast<int64_t>(described.bias.size())}));
      rule.bias = correction_bias.data<float>();
    }
    gate_weight = f32_on_device(ctx, gate.weight);
    gate_bias = f32_on_device(ctx, gate.bias);
    experts = moe::upload_experts(ctx, physical, dtype);
    if (host.shared_expert()) shared_expert.emplace(ctx, *host.shared_expert(), dtype);
    shared_gate = f32_on_device(ctx, host.shared_gate());
  }

  // Gate GEMM, then routing fused with the capture write (the ids reach the step's capture
  // buffer in the same kernel that hands them to the experts), then the fused experts.
  void forward(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step, moe::DeviceCaptureBuffer& capture,
               Tensor& out) const {
    const int64_t tokens = x.dim(0), hidden = x.dim(1), pairs = tokens * top_k;
    backend::Workspace::Scope scope(ctx.workspace());
    Tensor logits = ctx.scratch(DType::F32, {tokens, num_experts});
    ops::linear(ctx, x, gate_weight, gate_bias.if_defined(), logits);
    Tensor ids = ctx.scratch(DType::I32, {tokens, top_k});
    float* weights = capture.layer_weights(layer_id, tokens);
    const int32_t* forced = step.forced != nullptr ? step.forced + layer_id * tokens * top_k : nullptr;
    moe::route_on_device(ctx, logits, rule, forced, step.replayed, ids.data<int32_t>(), weights,
                         capture.layer_rows(layer_id));
    Tensor grouping = ctx.scratch(DType::I32, {moe::grouping_ints(experts.gate.dim(0), pairs)});
    Tensor activated = ctx.scratch(DType::F32, {pairs, experts.gate.dim(1)});
    Tensor expert_out = ctx.scratch(DType::F32, {pairs, hidden});
    moe::fused_experts_on_device(ctx, x, ids.data<int32_t>(), weights, top_k, experts, grouping, activated, expert_out,
                                 out);
    if (!shared_expert) return;
    Tensor shared = ctx.scratch(DType::F32, {tokens, hidden});
    shared_expert->forward(ctx, x, shared);
    Tensor gate;
    if (shared_gate.defined()) {  // Qwen2-MoE: out += sigmoid(x · g) * shared
      gate = ctx.scratch(DType::F32, {tokens, 1});
      ops::linear(ctx, x, shared_gate, nullptr, gate);
    }
    ops::add_rows(ctx, shared, gate.if_defined(), out);
  }
};

struct DeviceLayer {
  Tensor input_norm, post_attention_norm;
  std::optional<DeviceAttention> attention;
  std::optional<DeviceMlp> dense;
  std::optional<DeviceMoe> moe;
};

class DeviceDecoder final : public CausalLM {
 public:
  DeviceDecoder(backend::Context& ctx, std::unique_ptr<DecoderModel> host, DType dtype)
      : ctx_(ctx), host_(std::move(host)) {
    R3_CHECK(dtype == DType::F32 || dtype == DType::BF16, "--dtype: float32 or bfloat16 weights on the GPU, not ",
             dtype_name(dtype));
    R3_CHECK(ctx.device() == Device::kCuda, "place_on_device: not a CUDA context");
    R3_CHECK(!host_->eplb_options().active(), "--device cuda: EPLB (replicas, load windows, rebalancing) on the GPU "
                                              "is not supported yet");
    embed_ = on_device(ctx, host_->embed(), dtype);  // the lookup widens it exactly
    final_norm_ = f32_on_device(ctx, host_->final_norm());
    const bool tied = host_->lm_head().raw_data() == host_->embed().raw_data();
    lm_head_ = tied ? embed_ : on_device(ctx, host_->lm_head(), dtype);
    for (std::size_t l = 0; l < host_->layers().size(); ++l) {
      const DecoderLayer& layer = host_->layers()[l];
      DeviceLayer d;
      d.input_norm = f32_on_device(ctx, layer.input_norm);
      d.post_attention_norm = f32_on_device(ctx, layer.post_attention_norm);
      const auto* gqa = dynamic_cast<const GqaAttention*>(layer.attention.get());
      R3_CHECK(gqa != nullptr, "--device cuda: layer ", l,
               " uses multi-head latent attention, which has no CUDA kernels yet (DeepSeek-V2/V3, Kimi K2)");
      d.attention.emplace(ctx, *gqa, dtype);
      if (const auto* dense = dynamic_cast<const DenseFeedForward*>(layer.feed_forward.get())) {
        d.dense.emplace(ctx, dense->mlp(), dtype);
      } else {
        const auto* moe = dynamic_cast<const MoeFeedForward*>(layer.feed_forward.get());
        R3_CHECK(moe != nullptr, "--device cuda: layer ", l, "'s feed-forward has no CUDA kernels");
        d.moe.emplace(ctx, *moe, dtype);
      }
      layers_.push_back(std::move(d));
    }
  }

  const ModelInfo& info() const override { return host_->info(); }

  std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const override {
    KvCacheOptions options;
    options.device = &ctx_;
    return std::make_unique<KvCache>(host_->cache_specs(), max_seqs, capacity, options);
  }

  std::unique_ptr<ModelCache> make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                               int64_t block_size) const override {
    KvCacheOptions options;
    options.block_size = block_size;
    options.pool_blocks = pool_blocks;
    options.device = &ctx_;
    return std::make_unique<KvCache>(host_->cache_specs(), max_seqs, capacity, options);
  }

  std::vector<moe::MoeBlock*> moe_blocks() override { return host_->moe_blocks(); }

  void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                    Tensor& logits) const override {
    R3_CHECK(&ctx == &ctx_, "forward: a device model runs on the context it was placed with");
    const ModelInfo& info = host_->info();
    validate_batch(ctx.workspace(), batch, model_cache, info);
    check_logits_shape(batch, info, logits);
    auto* kv = dynamic_cast<KvCache*>(&model_cache);
    R3_CHECK(kv != nullptr && kv->on_device() && kv->num_layers() == static_cast<int64_t>(layers_.size()),
             "forward: the cache was not made by this device model");
    for (int64_t t = 0; t < batch.size(); ++t) {
      const int32_t seq = batch.seqs[static_cast<std::size_t>(t)];
      R3_CHECK(seq == ForwardBatch::kPadding || kv->covers(seq, batch.positions[static_cast<std::size_t>(t)]),
               "forward: position ", batch.positions[static_cast<std::size_t>(t)], " of sequence ", seq,
               " has no KV block (the engine must assign blocks before the step)");
    }
    const int64_t tokens = batch.size(), hidden = info.hidden_size;
    const auto moe_layers = static_cast<int64_t>(info.moe_layers.size());
    prepare(tokens, *kv);
    backend::Workspace::Scope step_scope(ctx.workspace());
    const std::span<std::span<const int32_t>> tables =
        ctx.workspace().array<std::span<const int32_t>>(kv->max_seqs());
    for (int64_t s = 0; s < kv->max_seqs(); ++s) tables[static_cast<std::size_t>(s)] = kv->block_table(0, s);
    const ops::DeviceStep step =
        steps_->build(batch.token_ids, batch.positions, batch.seqs, tables, batch.logit_rows,
                      {batch.forced_routing, batch.replayed});

    Tensor residual = ctx.scratch(DType::F32, {tokens, hidden});
    Tensor normed = ctx.scratch(DType::F32, {tokens, hidden});
    Tensor branch = ctx.scratch(DType::F32, {tokens, hidden});
    ops::cuda::embedding_ids_on_device(ctx, embed_, step.token_ids, tokens, residual);
    if (capture_) capture_->begin_step();
    const float eps = host_->rms_eps();
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const DeviceLayer& layer = layers_[l];
      ops::rms_norm(ctx, residual, &layer.input_norm, eps, normed);
      layer.attention->forward(ctx, normed, step, kv->device_pool(static_cast<int64_t>(l)), branch);
      ops::add_rows(ctx, branch, nullptr, residual);
      ops::rms_norm(ctx, residual, &layer.post_attention_norm, eps, normed);
      if (layer.moe) layer.moe->forward(ctx, normed, step, *capture_, branch);
      else layer.dense->forward(ctx, normed, branch);
      ops::add_rows(ctx, branch, nullptr, residual);
    }
    if (capture_) capture_->end_step(tokens);

    Tensor selected = ctx.scratch(DType::F32, {step.logit_row_count, hidden});
    ops::cuda::embedding_ids_on_device(ctx, residual, step.logit_rows, step.logit_row_count, selected);
    ops::rms_norm(ctx, selected, &final_norm_, eps, selected);
    Tensor device_logits = ctx.scratch(DType::F32, {step.logit_row_count, info.vocab_size});
    ops::linear(ctx, selected, lm_head_, nullptr, device_logits);
    backend::copy_to_host(ctx, device_logits, logits);  // the step's one wait

    if (moe_layers > 0) deliver_routing(ctx, batch);
    for (int64_t t = 0; t < tokens; ++t) {
      if (batch.seqs[t] != ForwardBatch::kPadding) kv->set_length(batch.seqs[t], batch.positions[t] + 1);
    }
  }

 private:
  // Sizes the step builder and the capture buffer for a step of `tokens` tokens over the cache's
  // slots (they only grow, so a warmed-up engine allocates nothing here).
  void prepare(int64_t tokens, const KvCache& kv) const {
    const ModelInfo& info = host_->info();
    const int64_t table_blocks = (kv.capacity() + kv.block_size() - 1) / kv.block_size();
    const auto moe_layers = static_cast<int64_t>(info.moe_layers.size());
    if (!steps_ || tokens > step_room_ || kv.max_seqs() > slot_room_ || table_blocks > table_room_) {
      step_room_ = std::max(step_room_, tokens);
      slot_room_ = std::max(slot_room_, kv.max_seqs());
      table_room_ = std::max(table_room_, table_blocks);
      steps_ = std::make_unique<DeviceStepBuilder>(ctx_, step_room_, slot_room_, table_room_, moe_layers, info.top_k);
    }
    if (moe_layers > 0 && (!capture_ || tokens > capture_room_)) {
      capture_room_ = std::max(capture_room_, tokens);
      capture_ = std::make_unique<moe::DeviceCaptureBuffer>(ctx_, capture_room_, moe_layers, info.top_k);
    }
  }

  // The captured rows to the step's host capture buffer (what the routing kernel wrote, which
  // is what the experts ran with), and each layer's tokens per expert to the step's loads.
  void deliver_routing(backend::Context& ctx, const ForwardBatch& batch) const {
    const ModelInfo& info = host_->info();
    const int64_t tokens = batch.size(), k = info.top_k;
    const auto moe_layers = static_cast<int64_t>(info.moe_layers.size());
    const std::span<const int32_t> rows = capture_->collect();           // [tokens, layers, k]
    const std::span<const float> weights = capture_->collected_weights();  // [layers, tokens, k]
    R3_CHECK(batch.capture != nullptr, "forward: MoE layers need the step's capture buffer");
    backend::Workspace::Scope scope(ctx.workspace());
    const std::span<int32_t> layer_ids = ctx.workspace().array<int32_t>(tokens * k);
    for (int64_t j = 0; j < moe_layers; ++j) {
      for (int64_t t = 0; t < tokens; ++t) {
        std::copy_n(rows.data() + (t * moe_layers + j) * k, k, layer_ids.data() + t * k);
      }
      batch.capture->record(j, layer_ids, weights.subspan(static_cast<std::size_t>(j * tokens * k),
                                                          static_cast<std::size_t>(tokens * k)));
      if (batch.loads == nullptr) continue;
      const std::span<int64_t> counts = batch.loads->layer(j);  // physical = logical: no replicas
      for (int64_t t = 0; t < tokens; ++t) {
        if (batch.seqs[t] == ForwardBatch::kPadding) continue;
        for (int64_t c = 0; c < k; ++c) ++counts[static_cast<std::size_t>(layer_ids[t * k + c])];
      }
    }
  }

  backend::Context& ctx_;
  std::unique_ptr<DecoderModel> host_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<DeviceLayer> layers_;
  mutable std::unique_ptr<DeviceStepBuilder> steps_;
  mutable std::unique_ptr<moe::DeviceCaptureBuffer> capture_;
  mutable int64_t step_room_ = 0, slot_room_ = 0, table_room_ = 0, capture_room_ = 0;
};

}  // namespace

std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model, DType weights) {
  auto* decoder = dynamic_cast<DecoderModel*>(model.get());
  R3_CHECK(decoder != nullptr, "--device cuda: ", model->info().architecture,
           " has no CUDA kernels yet (DeepSeek-V4's compressed attention comes in a later release); use --device cpu");
  model.release();
  return std::make_unique<DeviceDecoder>(ctx, std::unique_ptr<DecoderModel>(decoder), weights);
}

}  // namespace r3::models
