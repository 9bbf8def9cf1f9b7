// Kimi K3 (KimiK3ForCausalLM): KDA and gated MLA layers, dense SiTU MLPs and latent MoEs, joined
// by attention residuals instead of one residual sum. Layer l, with h the running in-block sum
// and S the block snapshots so far:
//   x = S empty ? h : pre_mix(S, h);  if l starts a block: S += h (and h leaves the sum)
//   a = attention(input_norm(x)) (+ h if l does not start a block)
//   h = a + mlp(post_norm(post_mix(S, a)))
// and after the last layer the logits come from lm_head(norm(output_mix(S, h))). A model class
// of its own, as DeepSeek-V4's, because DecoderModel's residual is one running sum.
#pragma once

#include <memory>
#include <vector>

#include "models/attention_layer.h"
#include "models/causal_lm.h"
#include "models/feed_forward.h"
#include "models/kimi_k3/attention_residual.h"
#include "models/kv_cache.h"

namespace r3::models {

struct KimiK3Layer {
  Tensor input_norm, post_attention_norm;
  std::unique_ptr<AttentionResidual> pre_attention_mix, post_attention_mix;  // self_attention_res_*, mlp_res_*
  std::unique_ptr<AttentionLayer> attention;  // KdaAttention or MlaAttention
  std::unique_ptr<FeedForward> feed_forward;  // SituFeedForward or LatentMoeFeedForward
};

class KimiK3Model final : public CausalLM {
 public:
  KimiK3Model(ModelInfo info, float rms_eps, int64_t block_size, Tensor embed, std::vector<KimiK3Layer> layers,
              std::unique_ptr<AttentionResidual> output_mix, Tensor final_norm, Tensor lm_head);

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const override;
  std::unique_ptr<ModelCache> make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                               int64_t block_size) const override;
  void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache, Tensor& logits) const override;
  std::vector<moe::MoeBlock*> moe_blocks() override;

  // What placing the model on a device copies (models/cuda/kimi_k3_on_device.cpp).
  float rms_eps() const { return rms_eps_; }
  int64_t block_size() const { return block_size_; }
  const std::vector<CacheSpec>& cache_specs() const { return cache_specs_; }
  const Tensor& embed() const { return embed_; }
  const std::vector<KimiK3Layer>& layers() const { return layers_; }
  const AttentionResidual& output_mix() const { return *output_mix_; }
  const Tensor& final_norm() const { return final_norm_; }
  const Tensor& lm_head() const { return lm_head_; }

 private:
  ModelInfo info_;
  float rms_eps_;
  int64_t block_size_;
  std::vector<CacheSpec> cache_specs_;
  bool has_recurrent_layers_ = false;  // Kimi Delta Attention layers: steps are checked for their runs
  Tensor embed_;
  std::vector<KimiK3Layer> layers_;
  std::unique_ptr<AttentionResidual> output_mix_;
  Tensor final_norm_, lm_head_;
};

}  // namespace r3::models
