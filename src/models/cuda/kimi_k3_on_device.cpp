// Kimi K3 on the device (models/cuda/device_decoder_parts.h): its attention-residual mixes,
// latent MoE and SiTU MLPs placed beside the shared attention kinds (KDA and gated MLA), and
// KimiK3Model::forward_into's layer loop over the device kernels. The decoder's step (metadata
// upload, graphs, capture, token draws) is the one every device model runs.
#include <cuda_runtime.h>

#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "models/cuda/device_decoder_parts.h"
#include "models/kimi_k3/latent_moe.h"
#include "ops/cuda/l2_prefetch.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/residual_mix.h"
#include "ops/rms_norm.h"

namespace r3::models::device {

SituMlp situ_on_device(backend::Context& ctx, const SituMlp& host, DType dtype) {
  return SituMlp(on_device(ctx, host.gate(), dtype), on_device(ctx, host.up(), dtype), on_device(ctx, host.down(), dtype),
                 host.activation());
}

LatentMoe::LatentMoe(backend::Context& ctx, const LatentMoeFeedForward& host, DType dtype, bool eplb,
                     moe::ExpertSlice slice)
    : moe(ctx, host.moe(), dtype, eplb, slice),
      down(on_device(ctx, host.latent().down, dtype)),
      norm(on_device(ctx, host.latent().norm, DType::F32)),
      up(on_device(ctx, host.latent().up, dtype)),
      rms_eps(host.rms_eps()),
      shared(situ_on_device(ctx, host.shared(), dtype)) {}

AttentionResidual residual_on_device(backend::Context& ctx, const AttentionResidual& host) {
  return AttentionResidual(on_device(ctx, host.query(), DType::F32), on_device(ctx, host.norm(), DType::F32),
                           host.eps());
}

// KimiK3Model::forward_into's loop: h (t.residual) is the running in-block sum, each block's
// first layer snapshots it, and a layer's two inputs are mixed from the snapshots and h.
void Decoder::run_residual_mix_layers(backend::Context& ctx, const ops::StepView& step, KvCache& kv,
                                      StepTensors& t) const {
  const int64_t tokens = step.tokens, hidden = p_.info.hidden_size, block = p_.residual_block_size;
  const auto layer_count = static_cast<int64_t>(p_.layers.size());
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor snapshots = ctx.scratch_for_output(DType::F32, {(layer_count + block - 1) / block, tokens, hidden});
  Tensor mixed = ctx.scratch_for_output(DType::F32, {tokens, hidden});
  Tensor& h = t.residual;
  const cudaStream_t stream = ctx.cuda_state().stream;
  const auto rows_bytes = sizeof(float) * static_cast<std::size_t>(tokens * hidden);
  auto copy_rows = [&](float* to, const float* from) {
    R3_CUDA_CHECK(cudaMemcpyAsync(to, from, rows_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  ops::cuda::embedding_ids_on_device(ctx, p_.embed, step.token_ids, tokens, h);
  int64_t taken = 0;
  for (int64_t l = 0; l < layer_count; ++l) {
    const Layer& layer = p_.layers[static_cast<std::size_t>(l)];
    const bool block_start = l % block == 0;
    if (taken > 0) layer.pre_mix->mix(ctx, snapshots, taken, h, mixed);
    else copy_rows(mixed.data<float>(), h.data<float>());
    if (block_start) copy_rows(snapshots.data<float>() + taken++ * tokens * hidden, h.data<float>());
    ops::rms_norm(ctx, mixed, &layer.input_norm, p_.rms_eps, t.normed);
    run_attention(ctx, layer, step, kv, l, t);
    if (!block_start) ops::add_rows(ctx, h, nullptr, t.branch);  // a block start's h is in the snapshots
    copy_rows(h.data<float>(), t.branch.data<float>());
    layer.post_mix->mix(ctx, snapshots, taken, h, mixed);
    ops::rms_norm(ctx, mixed, &layer.post_attention_norm, p_.rms_eps, t.normed);
    if (layer.latent_moe) {
      const LatentMoe& m = *layer.latent_moe;
      backend::Workspace::Scope moe_scope(ctx.workspace());
      const int64_t latent = m.down.dim(0);
      Tensor latent_in = ctx.scratch_for_output(DType::F32, {tokens, latent});
      ops::linear(ctx, t.normed, m.down, nullptr, latent_in);
      Tensor experts_out = ctx.scratch_for_output(DType::F32, {tokens, latent});
      run_moe(ctx, m.moe, t.normed, step, experts_out, &latent_in);  // routed on the hidden state
      ops::rms_norm(ctx, experts_out, &m.norm, m.rms_eps, experts_out);
      ops::linear(ctx, experts_out, m.up, nullptr, t.branch);
      Tensor shared = ctx.scratch_for_output(DType::F32, {tokens, hidden});
      m.shared.forward(ctx, t.normed, shared);
      ops::add_rows(ctx, shared, nullptr, t.branch);
    } else {
      layer.situ->forward(ctx, t.normed, t.branch);
    }
    ops::add_rows(ctx, t.branch, nullptr, h);
  }
  p_.output_mix->mix(ctx, snapshots, taken, h, mixed);
  ops::cuda::embedding_ids_on_device(ctx, mixed, step.logit_rows, step.logit_row_count, t.selected);
  ops::rms_norm(ctx, t.selected, &p_.final_norm, p_.rms_eps, t.selected);
  ops::linear(ctx, t.selected, p_.lm_head, nullptr, t.logits);
  ops::cuda::join_side_stream(ctx);  // the layers' L2 prefetches (a graph capture ends joined)
}

std::unique_ptr<CausalLM> place_kimi_k3(backend::Context& ctx, std::unique_ptr<KimiK3Model> host, DType weights,
                                        moe::MoePath moe_path, moe::ExpertSlice experts) {
  DecoderParts parts;
  parts.moe_path = moe_path;
  parts.info = host->info();
  parts.rms_eps = host->rms_eps();
  parts.cache_specs = host->cache_specs();
  parts.kv_dtype = weights;
  parts.reduced_precision = weights == DType::BF16;
  parts.residual_block_size = host->block_size();
  parts.embed = on_device(ctx, host->embed(), weights);
  parts.final_norm = on_device(ctx, host->final_norm(), DType::F32);
  const bool tied = host->lm_head().raw_data() == host->embed().raw_data();
  parts.lm_head = tied ? parts.embed : on_device(ctx, host->lm_head(), weights);
  parts.output_mix.emplace(residual_on_device(ctx, host->output_mix()));
  const bool eplb = host->eplb_options().active();
  for (std::size_t l = 0; l < host->layers().size(); ++l) {
    const KimiK3Layer& layer = host->layers()[l];
    Layer d;
    d.input_norm = on_device(ctx, layer.input_norm, DType::F32);
    d.post_attention_norm = on_device(ctx, layer.post_attention_norm, DType::F32);
    d.pre_mix.emplace(residual_on_device(ctx, *layer.pre_attention_mix));
    d.post_mix.emplace(residual_on_device(ctx, *layer.post_attention_mix));
    d.attention = layer.attention->placed(ctx, weights);
    if (const auto* moe = dynamic_cast<const LatentMoeFeedForward*>(layer.feed_forward.get())) {
      d.latent_moe.emplace(ctx, *moe, weights, eplb, experts);
    } else {
      const auto* dense = dynamic_cast<const SituFeedForward*>(layer.feed_forward.get());
      R3_CHECK(dense != nullptr, "--device cuda: Kimi K3 layer ", l, "'s feed-forward has no CUDA kernels");
      d.situ.emplace(situ_on_device(ctx, dense->mlp(), weights));
    }
    parts.layers.push_back(std::move(d));
  }
  const moe::EplbOptions options = host->eplb_options();
  parts.host = std::move(host);
  auto placed = std::make_unique<Decoder>(ctx, std::move(parts));
  placed->set_eplb_options(options);  // the engine's load windows and rebalancing run over the host's blocks
  return placed;
}

}  // namespace r3::models::device
