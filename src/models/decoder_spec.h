// The typed description of a Llama-style MoE decoder, produced from config.json by a family
// file (src/models/families) and consumed by the builder. Everything a family varies in is a
// field here; the checkpoint tensor names a family uses are in DecoderNames.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe/physical_experts.h"
#include "ops/rope_scaling.h"

namespace r3::models {

enum class QkNorm {
  kNone,
  kPerHead,  // RMSNorm over head_dim of each head (Qwen3-MoE)
  kFull,     // RMSNorm over the whole q / k projection (OLMoE)
};

enum class AttentionKind {
  kGroupedQuery,  // Llama-style q/k/v projections (GQA)
  kLatent,        // DeepSeek-V2/V3 multi-head latent attention (MLA)
};

// MLA: q through an optional LoRA, keys and values from a shared latent of kv_lora_rank plus one
// rotary key of qk_rope_head_dim; the cache holds only those two per position.
struct LatentAttentionSpec {
  int64_t q_lora_rank = 0;  // 0: a plain q projection
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::kGroupedQuery;
  LatentAttentionSpec latent;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  QkNorm qk_norm = QkNorm::kNone;
  double clip_qkv = 0;  // 0: no clipping
  double rope_theta = 10000.0;
  int64_t rotary_dim = 0;      // leading channels of each head that rotate; 0: all (head_dim)
  ops::RopeScaling rope_scaling;
  int64_t sliding_window = 0;  // 0: full causal attention (see DecoderSpec::layer_sliding)
  bool sinks = false;          // GPT-OSS: a learned per-head logit that absorbs probability mass
  // false: positions are not encoded (Kimi Linear's MLA keeps DeepSeek's rotary key part but
  // never rotates it).
  bool rotary = true;
};

// Which attention a layer has when a family mixes kinds (DecoderSpec::layer_attention).
enum class LayerAttention {
  kDefault,    // AttentionSpec::kind
  kKimiDelta,  // Kimi Delta Attention (models/kda_attention.h), with DecoderSpec::linear_attention
};

// Kimi Delta Attention's sizes.
struct LinearAttentionSpec {
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t conv_kernel = 0;
  std::optional<float> gate_lower_bound;  // Kimi K3's bounded forget gate
};

enum class RouterKind {
  kSoftmaxTopK,       // Qwen-MoE, Mixtral, OLMoE
  kSigmoidGroupTopK,  // DeepSeek-V3 / Kimi K2 / GLM-4.5: sigmoid + correction bias + group limit
  kSoftmaxGroupGreedy,  // DeepSeek-V2: softmax, greedy or group-limited greedy
  kTopKSoftmax,         // GPT-OSS: top-k of the (biased) logits, softmax over the k
};

enum class ExpertLayout {
  kPerExpert,    // experts.{e}.gate/up/down tensors, [out, in]
  kGptOssFused,  // experts.gate_up_proj [E, hidden, 2I] (gate/up interleaved), down_proj [E, I, hidden], biases
};

struct MoeSpec {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t expert_intermediate = 0;
  bool normalize_topk = false;
  int64_t shared_expert_intermediate = 0;  // 0: no shared expert
  bool shared_expert_gate = false;          // sigmoid(gate(x)) scales the shared expert
  RouterKind router = RouterKind::kSoftmaxTopK;
  bool router_has_bias = false;            // names.router_gate_bias
  ExpertLayout expert_layout = ExpertLayout::kPerExpert;
  moe::ExpertActivation activation;
  int64_t num_groups = 1, topk_groups = 1;  // kSigmoidGroupTopK
  double routed_scaling_factor = 1.0;       // kSigmoidGroupTopK
};

// Checkpoint names. "{i}" is replaced by the layer index, "{e}" by the expert index.
struct DecoderNames {
  std::string embed = "model.embed_tokens.weight";
  std::string final_norm = "model.norm.weight";
  std::string lm_head = "lm_head.weight";
  std::string layer = "model.layers.{i}.";
  std::string input_norm = "input_layernorm.weight";
  std::string post_attention_norm = "post_attention_layernorm.weight";
  std::string attention = "self_attn.";
  std::string dense_mlp = "mlp.";
  std::string moe = "mlp.";
  std::string router = "gate.weight";
  std::string router_bias = "gate.e_score_correction_bias";
  std::string router_gate_bias = "router.bias";
  std::string expert = "experts.{e}.";
  std::string expert_gate = "gate_proj.weight";
  std::string expert_up = "up_proj.weight";
  std::string expert_down = "down_proj.weight";
  std::string shared_expert = "shared_expert.";  // Qwen2-MoE; DeepSeek and GLM: "shared_experts."
  std::string shared_expert_gate = "shared_expert_gate.weight";
};

struct DecoderSpec {
  std::string family;        // e.g. "qwen3_moe"
  std::string architecture;  // e.g. "Qwen3MoeForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t dense_intermediate = 0;  // width of dense (non-MoE) layers' MLP
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<int32_t> eos_token_ids;  // generation stops after one of these
  AttentionSpec attention;
  MoeSpec moe;
  std::vector<bool> layer_is_moe;  // one entry per layer
  // Which layers use attention.sliding_window (GPT-OSS alternates); empty: every layer.
  std::vector<bool> layer_sliding;
  // Each layer's attention when a family mixes kinds (Kimi Linear); empty: every layer kDefault.
  std::vector<LayerAttention> layer_attention;
  LinearAttentionSpec linear_attention;
  DecoderNames names;

  std::vector<int64_t> moe_layers() const;  // indices of the MoE layers
  void validate() const;                    // throws r3::Error on inconsistent fields
};

std::string expand_name(std::string pattern, int64_t layer, int64_t expert = -1);

}  // namespace r3::models
