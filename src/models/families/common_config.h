// config.json fields that the Llama-style MoE families share (sizes, heads, norms, rotary).
#pragma once

#include "io/hf_config.h"
#include "models/decoder_spec.h"

namespace r3::models {

// Fills the fields every family reads the same way; family files then add their own.
void read_common_decoder_config(const HfConfig& config, DecoderSpec& spec);

// The Qwen-MoE rule: layer i is MoE unless listed in mlp_only_layers, when num_experts > 0 and
// (i + 1) % decoder_sparse_step == 0.
// DeepSeek-V2/V3 family fields: multi-head latent attention, routed + shared experts with the
// first `first_k_dense_replace` layers dense (router fields are the caller's).
void read_deepseek_common(const HfConfig& config, DecoderSpec& spec);

std::vector<bool> sparse_step_moe_layers(const HfConfig& config, int64_t num_layers,
                                         int64_t num_experts);

}  // namespace r3::models
