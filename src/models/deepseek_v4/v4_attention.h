// DeepSeek-V4 attention: q LoRA (RMSNorm on the latent, unweighted RMSNorm per head), one shared
// K=V head with RMSNorm, rotary on the trailing channels, per-head attention sinks, a sliding
// window over recent positions plus compressed entries (HCA: every entry already complete at the
// query; CSA: the `index_topk` entries a lightning indexer picks), the inverse rotation on the
// output, and a grouped low-rank output projection.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "models/deepseek_v4/v4_cache.h"
#include "models/deepseek_v4/window_compressor.h"
#include "models/forward_batch.h"

namespace r3::models {

struct V4AttentionWeights {
  Tensor wq_a, q_norm, wq_b;  // [q_lora, H], [q_lora], [heads * D, q_lora]
  Tensor wkv, kv_norm;        // [D, H], [D]
  Tensor wo_a, wo_b;          // [groups * o_lora, heads * D / groups], [H, groups * o_lora]
  Tensor sinks;               // [heads]
  // Indexer (CSA only).
  Tensor index_wq_b;          // [index_heads * Di, q_lora]
  Tensor index_weights_proj;  // [index_heads, H]
};

class V4Attention {
 public:
  V4Attention(const DeepseekV4Spec& spec, int64_t layer, V4AttentionWeights weights,
              std::optional<WindowCompressor> compressor, std::optional<WindowCompressor> indexer,
              const ops::TrailingInterleavedRotary& rotary, const ops::TrailingInterleavedRotary& compress_rotary);

  // x: normalised input F32 [tokens, hidden]; out: F32 [tokens, hidden].
  void forward(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch, V4Cache& cache, Tensor& out) const;

 private:
  // Per-thread scratch of the attention loop, from the step workspace.
  struct Scratch {
    backend::Context::PerThread<const float*> keys;  // rows one query attends to
    backend::Context::PerThread<float> scores;        // indexer scores of every entry
    backend::Context::PerThread<std::pair<double, int64_t>> topk;
    backend::Context::PerThread<int32_t> picked;     // entries one query attends to
  };
  // Writes the compressed entries a query at `pos` may attend to (indices into its sequence's
  // entries, ascending) to picked and returns how many; index: the sequence's indexer (CSA) or null.
  int64_t visible_entries(const float* index_q, const float* index_w, int64_t pos, const CompressorView* index,
                          int64_t num_entries, const Scratch& scratch, int32_t* picked) const;

  int64_t layer_;
  V4AttentionKind kind_;
  int64_t heads_, head_dim_, q_lora_, groups_, o_lora_, window_;
  int64_t index_heads_, index_dim_, index_topk_;
  float rms_eps_;
  V4AttentionWeights w_;
  std::optional<WindowCompressor> compressor_, indexer_;
  const ops::TrailingInterleavedRotary& rotary_;
  const ops::TrailingInterleavedRotary& compress_rotary_;
};

}  // namespace r3::models
