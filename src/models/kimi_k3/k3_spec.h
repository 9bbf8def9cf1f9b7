// Kimi K3's configuration: Kimi Linear's layer schedule, KDA and latent-attention sizes and
// DeepSeek-V3 routing (a DecoderSpec read as for kimi_linear), plus what K3 adds: the bounded
// forget gate and full-rank output gate of its KDA layers, the output gate of its MLA layers,
// the latent MoE's width, the SiTU activation and the attention residuals' block size.
#pragma once

#include "io/hf_config.h"
#include "models/decoder_spec.h"

namespace r3::models {

struct KimiK3Spec {
  DecoderSpec decoder;
  int64_t latent_width = 0;           // routed_expert_hidden_size: where the routed experts run
  int64_t residual_block_size = 0;    // attn_res_block_size: a block starts at every multiple
  bool full_rank_output_gate = true;  // KDA's g_proj (false: g_a_proj / g_b_proj)
  float situ_beta = 4.0f;             // activation_situ_beta
  float situ_linear_beta = 25.0f;     // activation_situ_linear_beta (inf: up not capped)
  // The MLA q / kv low-rank norms' epsilon: transformers' RMSNorm default, not rms_norm_eps (as
  // Moonshot's code).
  float latent_norm_eps = 1e-6f;

  static KimiK3Spec parse(const HfConfig& config);
};

}  // namespace r3::models
