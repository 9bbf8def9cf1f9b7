// A decoder-only MoE language model assembled from a DecoderSpec: embedding, layers of
// (RMSNorm -> attention -> residual, RMSNorm -> feed-forward -> residual), final norm, lm_head.
#pragma once

#include <memory>
#include <vector>

#include "models/causal_lm.h"
#include "models/feed_forward.h"
#include "models/gqa_attention.h"
#include "models/kv_cache.h"

namespace r3::models {

struct DecoderLayer {
  Tensor input_norm;
  Tensor post_attention_norm;
  std::unique_ptr<AttentionLayer> attention;
  std::unique_ptr<FeedForward> feed_forward;
};

// The cache a model of these per-layer cache specs made, or an error saying it was made by
// another model (the host decoder and Kimi K3 both check it).
KvCache& model_kv_cache(ModelCache& model_cache, const std::vector<CacheSpec>& specs);

// Throws unless every non-padding token's position has a KV block in `cache` (the engine assigns
// blocks before a step); the host and device decoders both check it.
void check_kv_blocks(const ForwardBatch& batch, const KvCache& cache);

// Throws unless each sequence's rows of the step are one run of consecutive positions continuing
// its cached length: what a recurrent layer's state needs (it has taken in exactly the cached
// positions, and the step ops take a sequence's rows as one run). The decoders with such layers
// check it before a step.
void check_runs_continue_states(const ForwardBatch& batch, const KvCache& cache, backend::Workspace& workspace);

class DecoderModel final : public CausalLM {
 public:
  DecoderModel(ModelInfo info, float rms_eps, Tensor embed, std::vector<DecoderLayer> layers, Tensor final_norm,
               Tensor lm_head);

  const ModelInfo& info() const override { return info_; }
  // A KvCache built from the layers' cache specs, with default options (blocks of 16 positions).
  std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const override;
  std::unique_ptr<ModelCache> make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                               int64_t block_size) const override;
  std::unique_ptr<KvCache> make_kv_cache(int64_t max_seqs, int64_t capacity, KvCacheOptions options) const;
  // What each layer caches per position, in layer order.
  const std::vector<CacheSpec>& cache_specs() const { return cache_specs_; }
  void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache, Tensor& logits) const override;
  std::vector<moe::MoeBlock*> moe_blocks() override;

  // What a device copy of the model reads (models/device_decoder.h).
  float rms_eps() const { return rms_eps_; }
  const Tensor& embed() const { return embed_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  const Tensor& final_norm() const { return final_norm_; }
  const Tensor& lm_head() const { return lm_head_; }

 private:

  ModelInfo info_;
  float rms_eps_;
  std::vector<CacheSpec> cache_specs_;
  bool has_recurrent_layers_ = false;  // Kimi Delta Attention layers: steps are checked for their runs
  Tensor embed_;
  std::vector<DecoderLayer> layers_;
  Tensor final_norm_;
  Tensor lm_head_;
};

}  // namespace r3::models
