// DeepSeek-V4: hyper-connected residual streams around V4 attention and an MoE (routed experts
// through the shared MoE pipeline, plus a shared expert) in every layer, a hyper head, the final
// norm and the LM head.
#pragma once

#include <memory>
#include <vector>

#include "models/causal_lm.h"
#include "models/deepseek_v4/hyper_connection.h"
#include "models/deepseek_v4/v4_attention.h"
#include "models/swiglu_mlp.h"

namespace r3::models {

struct V4Layer {
  Tensor attn_norm, ffn_norm;
  std::unique_ptr<HyperConnection> attn_hc, ffn_hc;
  std::unique_ptr<V4Attention> attention;
  std::unique_ptr<moe::MoeBlock> moe;
  std::unique_ptr<SwigluMlp> shared_expert;
};

class DeepseekV4Model final : public CausalLM {
 public:
  DeepseekV4Model(DeepseekV4Spec spec, ModelInfo info, Tensor embed, std::vector<V4Layer> layers,
                  std::unique_ptr<HyperHead> head, Tensor final_norm, Tensor lm_head,
                  std::unique_ptr<ops::TrailingInterleavedRotary> main_rotary,
                  std::unique_ptr<ops::TrailingInterleavedRotary> compress_rotary);

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const override;
  // The same with a block size (and, for tests, scattered blocks) of the caller's choice.
  std::unique_ptr<V4Cache> make_v4_cache(int64_t max_seqs, int64_t capacity, V4CacheOptions options) const;
  void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache, Tensor& logits) const override;
  std::vector<moe::MoeBlock*> moe_blocks() override;

 private:
  DeepseekV4Spec spec_;
  ModelInfo info_;
  Tensor embed_;
  std::vector<V4Layer> layers_;
  std::unique_ptr<HyperHead> head_;
  Tensor final_norm_, lm_head_;
  std::unique_ptr<ops::TrailingInterleavedRotary> main_rotary_, compress_rotary_;  // referenced by layers
};

}  // namespace r3::models
