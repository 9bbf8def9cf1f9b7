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
  // Routing of every token is written to `capture` when it is not null (capture->begin_step
  // is the caller's). Updates the cache lengths of the slots in the batch.
  Tensor forward(ThreadPool& pool, const ForwardBatch& batch, KvCache& cache,
                 moe::RoutingCapture* capture) const;

 private:
  void validate(const ForwardBatch& batch, const KvCache& cache) const;

  ModelInfo info_;
  float rms_eps_;
  int64_t kv_width_;
  Tensor embed_;
  std::vector<DecoderLayer> layers_;
  Tensor final_norm_;
  Tensor lm_head_;
};

}  // namespace r3::models
