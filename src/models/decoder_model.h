// A decoder-only MoE language model assembled from a DecoderSpec: embedding, layers of
// (RMSNorm -> attention -> residual, RMSNorm -> feed-forward -> residual), final norm, lm_head.
#pragma once

#include <memory>
#include <vector>

#include "models/feed_forward.h"
#include "models/forward_batch.h"
#include "models/gqa_attention.h"
#include "models/kv_cache.h"
#include "models/model_info.h"
#include "moe/eplb/eplb_controller.h"

namespace r3::models {

struct DecoderLayer {
  Tensor input_norm;
  Tensor post_attention_norm;
  std::unique_ptr<GqaAttention> attention;
  std::unique_ptr<FeedForward> feed_forward;
};

class DecoderModel {
 public:
  DecoderModel(ModelInfo info, float rms_eps, int64_t kv_width, Tensor embed,
               std::vector<DecoderLayer> layers, Tensor final_norm, Tensor lm_head);

  const ModelInfo& info() const { return info_; }

  // A cache for `max_slots` sequences of up to `capacity` tokens.
  KvCache make_kv_cache(int64_t max_slots, int64_t capacity) const;

  // Runs one step and returns logits F32 [rows, vocab] for batch.logit_rows (all rows if empty).
  // Routing reaches whatever capture sink is bound to the MoE layers (moe/capture_binder.h).
  // Updates the cache lengths of the slots in the batch.
  Tensor forward(ThreadPool& pool, const ForwardBatch& batch, KvCache& cache) const;

  // The MoE layers in order; index j has layer id j.
  std::vector<moe::MoeBlock*> moe_blocks();
  // Call after each step: EPLB load windows and rebalancing (no-op without EPLB).
  void end_step();
  void set_eplb(std::unique_ptr<moe::EplbController> eplb) { eplb_ = std::move(eplb); }
  const moe::EplbController* eplb() const { return eplb_.get(); }

 private:
  void validate(const ForwardBatch& batch, const KvCache& cache) const;

  ModelInfo info_;
  float rms_eps_;
  int64_t kv_width_;
  Tensor embed_;
  std::vector<DecoderLayer> layers_;
  Tensor final_norm_;
  Tensor lm_head_;
  std::unique_ptr<moe::EplbController> eplb_;
};

}  // namespace r3::models
