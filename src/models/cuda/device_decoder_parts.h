// The pieces of a decoder on a CUDA device (models/device_decoder.h): each layer's weights in
// device memory with its forward step, and the model that runs them. Made from a loaded host
// model (device_decoder.cpp) or from random weights at a given shape (synthetic_decoder.cpp).
// Internal to models/cuda.
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "backend/context.h"
#include "models/decoder_model.h"
#include "models/device_step_builder.h"
#include "moe/device_capture.h"
#include "moe/device_experts.h"
#include "moe/device_routing.h"
#include "ops/device_step.h"
#include "ops/rotary.h"

namespace r3::models::device {

// A host weight in device memory as `dtype`, or an undefined tensor for an absent optional weight.
Tensor on_device(backend::Context& ctx, const Tensor& host, DType dtype);

// A host MLP with its matrices on the device as `dtype` (SwigluMlp's forward runs wherever its
// context does).
SwigluMlp mlp_on_device(backend::Context& ctx, const SwigluMlp& host, DType dtype);

struct Attention {
  AttentionSpec spec;
  float rms_eps;
  ops::Rotary rotary;  // frequencies, passed to the kernel by value
  int64_t sliding_window;
  Tensor q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm, sinks;

  Attention(const AttentionSpec& attention, float eps, ops::Rotary rope, int64_t window)
      : spec(attention), rms_eps(eps), rotary(std::move(rope)), sliding_window(window) {}
  Attention(backend::Context& ctx, const GqaAttention& host, DType dtype);
  // Every row's keys and values are written before any token reads the pool, so a step may
  // bring any number of a sequence's positions (the device pools keep every position).
  void forward(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step, const ops::DeviceKvPool& pool,
               Tensor& out) const;
};

struct Moe {
  int64_t layer_id = 0;
  int64_t num_experts = 0, top_k = 0;
  Tensor gate_weight, gate_bias, correction_bias;
  moe::DeviceRoutingRule rule;
  moe::DeviceExperts experts;
  std::optional<SwigluMlp> shared_expert;
  Tensor shared_gate;

  Moe() = default;
  Moe(backend::Context& ctx, const MoeFeedForward& host, DType dtype);
  // Gate GEMM, then routing fused with the capture write (the ids reach the step's capture
  // buffer in the same kernel that hands them to the experts), then the fused experts.
  void forward(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step, moe::DeviceCaptureBuffer& capture,
               Tensor& out) const;
};

struct Layer {
  Tensor input_norm, post_attention_norm;
  std::optional<Attention> attention;
  std::optional<SwigluMlp> dense;
  std::optional<Moe> moe;
};

// What a decoder on the device is made of; `host` is the model it was copied from (kept alive
// for its checkpoint mapping and MoE blocks), or null for random weights.
struct DecoderParts {
  ModelInfo info;
  float rms_eps = 0;
  std::vector<CacheSpec> cache_specs;
  Tensor embed, final_norm, lm_head;
  std::vector<Layer> layers;
  std::unique_ptr<DecoderModel> host;
};

class Decoder final : public CausalLM {
 public:
  Decoder(backend::Context& ctx, DecoderParts parts);

  const ModelInfo& info() const override { return p_.info; }
  std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const override;
  std::unique_ptr<ModelCache> make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                               int64_t block_size) const override;
  // The host model's MoE blocks (capture binding); none for random weights.
  std::vector<moe::MoeBlock*> moe_blocks() override;
  void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                    Tensor& logits) const override;

 private:
  // Sizes the step builder and the capture buffer for a step of `tokens` tokens over the cache's
  // slots (they only grow, so a warmed-up engine allocates nothing here).
  void prepare(int64_t tokens, const KvCache& kv) const;
  // The captured rows to the step's host capture buffer (what the routing kernel wrote, which
  // is what the experts ran with), and each layer's tokens per expert to the step's loads.
  void deliver_routing(backend::Context& ctx, const ForwardBatch& batch) const;

  backend::Context& ctx_;
  DecoderParts p_;
  mutable std::unique_ptr<DeviceStepBuilder> steps_;
  mutable std::unique_ptr<moe::DeviceCaptureBuffer> capture_;
  mutable int64_t step_room_ = 0, slot_room_ = 0, table_room_ = 0, capture_room_ = 0;
};

}  // namespace r3::models::device
