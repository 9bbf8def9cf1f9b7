// DeepSeek-V4's config.json as a typed spec (transformers 5.17 DeepseekV4Config semantics).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "ops/rope_scaling.h"

namespace r3::models {

enum class V4AttentionKind {
  kSliding,     // "sliding_attention": sliding-window MQA only
  kCompressed,  // "compressed_sparse_attention" (CSA): + overlapping compressor and indexer
  kHeavy,       // "heavily_compressed_attention" (HCA): + non-overlapping compressor
};

// Bounds on the hyper-connection fields (see parse for why).
inline constexpr int64_t kMaxHcMult = 64;
inline constexpr int64_t kMaxSinkhornIters = 1000;

struct DeepseekV4Spec {
  std::string architecture;
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<int32_t> eos_token_ids;

  // Attention: shared-KV MQA (one KV head), q LoRA, grouped output projection, sinks.
  int64_t num_heads = 0, head_dim = 0, q_lora_rank = 0, o_groups = 0, o_lora_rank = 0;
  int64_t rope_dim = 0;  // trailing rotary channels per head
  // Two rotaries: "main" for sliding-only layers, "compress" for CSA/HCA layers (their attention,
  // compressors and indexer). Released checkpoints use YaRN on the compress one only.
  double main_rope_theta = 10000.0, compress_rope_theta = 160000.0;
  ops::RopeScaling main_rope_scaling, compress_rope_scaling;
  int64_t sliding_window = 0;
  std::vector<V4AttentionKind> layer_kinds;
  int64_t csa_rate = 4, hca_rate = 128;
  int64_t index_heads = 0, index_head_dim = 0, index_topk = 0;

  // Hyper-connections.
  int64_t hc_mult = 1, hc_sinkhorn_iters = 1;
  double hc_eps = 1e-6;

  // MoE (every layer): sqrt-softplus scores, biased top-k or hash tables.
  int64_t num_experts = 0, top_k = 0, moe_intermediate = 0;
  double routed_scaling_factor = 1.0, swiglu_limit = 0;  // 0: no clamp
  std::vector<bool> hash_layer;

  static DeepseekV4Spec parse(const HfConfig& config);

  // Frequencies and cos/sin scaling of each rotary, as transformers computes them.
  ops::RopeFrequencies main_rope() const;
  ops::RopeFrequencies compress_rope() const;
};

}  // namespace r3::models
