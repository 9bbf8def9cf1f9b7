// config.json fields that the Llama-style MoE families share (sizes, heads, norms, rotary).
#pragma once

#include "io/hf_config.h"
#include "models/decoder_spec.h"

namespace r3::models {

// Bounds on config counts that size loops and per-layer tables before any tensor is checked.
// The largest published MoE models have under 100 layers (DeepSeek-V3: 61, Qwen3-235B: 94) and
// at most a few hundred routed experts (Kimi K2: 384); the bounds leave ample headroom while
// keeping a hostile config from looping 2^33 times or sizing tables by it.
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxExperts = 65536;

// Fills the fields every family reads the same way; family files then add their own.
void read_common_decoder_config(const HfConfig& config, DecoderSpec& spec);

// The Qwen-MoE rule: layer i is MoE unless listed in mlp_only_layers, when num_experts > 0 and
// (i + 1) % decoder_sparse_step == 0.
// DeepSeek-style MoE fields (DeepSeek-V2/V3, GLM-4.5): routed experts, shared experts of width
// moe_intermediate_size * n_shared_experts, expert groups, routed_scaling_factor, the first
// `first_k_dense_replace` layers dense. The router kind is the caller's.
void read_deepseek_style_moe(const HfConfig& config, int64_t default_shared_experts, DecoderSpec& spec);

// Multi-head latent attention's sizes (DeepSeek-V2/V3, Kimi Linear's full-attention layers).
void read_latent_attention(const HfConfig& config, DecoderSpec& spec);

// DeepSeek-V2/V3 family fields: multi-head latent attention plus the DeepSeek-style MoE.
void read_deepseek_common(const HfConfig& config, DecoderSpec& spec);

// Mixtral's expert names, which Kimi Linear's checkpoints use too: experts.{e}.w1 (gate), w3 (up)
// and w2 (down) under block_sparse_moe.
void use_block_sparse_moe_names(DecoderSpec& spec);

std::vector<bool> sparse_step_moe_layers(const HfConfig& config, int64_t num_layers,
                                         int64_t num_experts);

}  // namespace r3::models
