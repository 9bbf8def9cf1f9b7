// The decoder on a CUDA device (models/device_decoder.h): the step of DecoderModel::forward_into
// over the device layers (models/cuda/device_layers.cpp), and placing a loaded model there.
#include "models/device_decoder.h"

#include <algorithm>

#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "models/cuda/device_decoder_parts.h"
#include "models/kimi_k3/kimi_k3_model.h"
#include "ops/cuda/l2_prefetch.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

namespace device {

Decoder::Decoder(backend::Context& ctx, DecoderParts parts) : ctx_(ctx), p_(std::move(parts)) {
  R3_CHECK(ctx.device() == Device::kCuda, "a device decoder needs a CUDA context");
  R3_CHECK(!p_.layers.empty(), "a device decoder needs at least one layer");
  for (const CacheSpec& spec : p_.cache_specs) {
    has_recurrent_layers_ = has_recurrent_layers_ || spec.kind == CacheSpec::Kind::kRecurrentState;
  }
  if (p_.host) {
    set_parameters(p_.host->shared_parameters());
    // The weights are on the device now: the host keeps no resident copy of the checkpoint's
    // pages (the host model stays for its MoE blocks' placement; a page it touches is read back).
    (void)p_.host->parameters().release_mapped_pages();
  }
}

namespace {

}  // namespace

Decoder::~Decoder() { drop_graphs(); }

void Decoder::drop_graphs() const {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
  graphs_.clear();
}

std::unique_ptr<ModelCache> Decoder::make_cache(int64_t max_seqs, int64_t capacity) const {
  KvCacheOptions options;
  options.device = &ctx_;
  options.device_dtype = p_.kv_dtype;
  return std::make_unique<KvCache>(p_.cache_specs, max_seqs, capacity, options);
}

std::unique_ptr<ModelCache> Decoder::make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                                      int64_t block_size) const {
  KvCacheOptions options;
  options.block_size = block_size;
  options.pool_blocks = pool_blocks;
  options.device = &ctx_;
  options.device_dtype = p_.kv_dtype;
  return std::make_unique<KvCache>(p_.cache_specs, max_seqs, capacity, options);
}

std::vector<moe::MoeBlock*> Decoder::moe_blocks() {
  return p_.host ? p_.host->moe_blocks() : std::vector<moe::MoeBlock*>{};
}

void Decoder::forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                           Tensor& logits) const {
  check_logits_shape(batch, p_.info, logits);
  run_step(ctx, batch, model_cache, [&](const Tensor& on_device) { backend::copy_to_host(ctx, on_device, logits); });
}

void Decoder::forward_drawn(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                            std::span<const ops::TokenDraw> draws, std::span<ops::DrawnToken> drawn) const {
  R3_CHECK(static_cast<int64_t>(draws.size()) == logit_row_count(batch) && drawn.size() == draws.size(),
           "forward: ", draws.size(), " draws and ", drawn.size(), " results for ", logit_row_count(batch),
           " logits rows");
  run_step(ctx, batch, model_cache, [&](const Tensor& on_device) { drawer_.draw(ctx, on_device, draws, drawn); });
}

void Decoder::run_step(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                       FunctionRef<void(const Tensor& logits)> finish) const {
  R3_CHECK(&ctx == &ctx_, "forward: a device model runs on the context it was placed with");
  // The calling thread's device becomes the model's (expert-parallel ranks step on threads of
  // their own, one per GPU).
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  dispatcher_ = batch.dispatcher;
  const ModelInfo& info = p_.info;
  validate_batch(ctx.workspace(), batch, model_cache, info);
  auto* kv = dynamic_cast<KvCache*>(&model_cache);
  R3_CHECK(kv != nullptr && kv->on_device() && kv->num_layers() == static_cast<int64_t>(p_.layers.size()),
           "forward: the cache was not made by this device model");
  check_kv_blocks(batch, *kv);
  if (has_recurrent_layers_) check_runs_continue_states(batch, *kv, ctx.workspace());
  const int64_t tokens = batch.size(), hidden = info.hidden_size;
  prepare(tokens, *kv);
  const backend::ReducedPrecisionScope precision(ctx, p_.reduced_precision);
  backend::Workspace::Scope step_scope(ctx.workspace());
  const std::span<std::span<const int32_t>> tables = ctx.workspace().array<std::span<const int32_t>>(kv->max_seqs());
  for (int64_t s = 0; s < kv->max_seqs(); ++s) tables[static_cast<std::size_t>(s)] = kv->block_table(0, s);
  const ops::StepView step = steps_->build(batch.token_ids, batch.positions, batch.seqs, tables, batch.logit_rows,
                                             {batch.forced_routing, batch.replayed});

  StepTensors st;  // every one written in full by its first kernel: no fill needed
  st.residual = ctx.scratch_for_output(DType::F32, {tokens, hidden});
  st.normed = ctx.scratch_for_output(DType::F32, {tokens, hidden});
  st.branch = ctx.scratch_for_output(DType::F32, {tokens, hidden});
  st.selected = ctx.scratch_for_output(DType::F32, {step.logit_row_count, hidden});
  st.logits = ctx.scratch_for_output(DType::F32, {step.logit_row_count, info.vocab_size});
  const bool capturing = capture_ && p_.capture_routing;
  bool host_map = false;
  for (const Layer& layer : p_.layers) {
    const Moe* moe = layer.routed_moe();
    if (moe == nullptr) continue;
    moe->follow_placement(ctx, ep_dispatcher());  // after a rebalance of the step before
    host_map = host_map || moe->host_map();
  }
  if (capturing) capture_->begin_step();
  if (loads_) loads_->begin_step();
  moe_layers_routed_ = 0;
  try {
    // Replay steps run eagerly (their forced ids are optional pointers), and so do a map a test
    // replaced (it runs on the host) and expert parallelism (each MoE layer waits for the counts
    // that size its exchanges).
    if (step.forced == nullptr && !host_map && dispatcher_ == nullptr) run_layers_graphed(ctx, step, *kv, st);
    else run_layers(ctx, step, *kv, st);
  } catch (...) {
    // What was captured before the failure reaches the capture buffer (as on the CPU, where the
    // layers before the failing one have recorded).
    if (capturing) {
      capture_->end_step(tokens);
      deliver_routing(batch, moe_layers_routed_);
    }
    throw;
  }
  if (capturing) capture_->end_step(tokens);
  if (loads_) loads_->end_step();
  finish(st.logits);  // the step's one wait

  if (capturing) deliver_routing(batch, static_cast<int64_t>(info.moe_layers.size()));
  if (loads_) deliver_loads(batch);
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.seqs[t] != ForwardBatch::kPadding) kv->set_length(batch.seqs[t], batch.positions[t] + 1);
  }
}

void Decoder::run_attention(backend::Context& ctx, const Layer& layer, const ops::StepView& step, KvCache& kv,
                            int64_t l, StepTensors& t) const {
  layer.attention->forward(ctx, t.normed, step, kv, l, t.branch);
}

Decoder::Routed Decoder::route(backend::Context& ctx, const Moe& moe, const Tensor& normed,
                               const ops::StepView& step) const {
  const int64_t j = moe.layer_id, tokens = step.tokens;
  const moe::DeviceCaptureRows rows = p_.capture_routing ? capture_->layer_rows(j) : moe::DeviceCaptureRows{};
  int32_t* ids = ctx.scratch_for_output(DType::I32, {tokens, moe.top_k}).data<int32_t>();
  float* weights = capture_->layer_weights(j, tokens);
  const moe::DeviceCapturedRouting captured = moe.route(ctx, normed, step, ids, weights, rows);
  moe_layers_routed_ = j + 1;
  return {captured, loads_ ? loads_->layer(j) : nullptr};
}

void Decoder::run_moe(backend::Context& ctx, const Moe& moe, const Tensor& normed, const ops::StepView& step,
                      Tensor& out, const Tensor* experts_in) const {
  backend::Workspace::Scope scope(ctx.workspace());
  const bool modular = p_.moe_path == moe::MoePath::kModular;
  if (dispatcher_ != nullptr) {  // expert parallelism: every path routes, then dispatches
    const Routed routed = route(ctx, moe, normed, step);
    const Tensor& experts_x = experts_in != nullptr ? *experts_in : normed;
    const moe::ep::ExpertParallelDispatcher* ep = ep_dispatcher();
    R3_CHECK(ep != nullptr && ep->device_exchange() != nullptr,
             "forward: a device model's expert-parallel rank needs a dispatcher with a device exchange");
    moe.run_experts_over_gpus(ctx, experts_x, step, routed.captured, routed.loads, *ep, device_owners(ctx, *ep),
                              out);
    return;
  }
  R3_CHECK(moe.holds_every_expert(), "forward: MoE layer ", moe.layer_id,
           " holds a slice of its experts (an expert-parallel rank's placement) and runs only as that rank");
  if (p_.moe_path != moe::MoePath::kMonolithic || !moe.monolithic_fits(step.tokens)) {
    const Routed routed = route(ctx, moe, normed, step);
    moe.run_experts(ctx, experts_in != nullptr ? *experts_in : normed, step, routed.captured, routed.loads, out,
                    modular);
    return;
  }
  const int64_t j = moe.layer_id, tokens = step.tokens;
  int32_t* ids = ctx.scratch_for_output(DType::I32, {tokens, moe.top_k}).data<int32_t>();
  moe.route_and_run_experts(ctx, normed, step, ids, capture_->layer_weights(j, tokens),
                            p_.capture_routing ? capture_->layer_rows(j) : moe::DeviceCaptureRows{},
                            loads_ ? loads_->layer(j) : nullptr, out, experts_in);
  moe_layers_routed_ = j + 1;
}

const moe::ep::ExpertParallelDispatcher* Decoder::ep_dispatcher() const {
  return dynamic_cast<const moe::ep::ExpertParallelDispatcher*>(dispatcher_);
}

const int32_t* Decoder::device_owners(backend::Context& ctx, const moe::ep::ExpertParallelDispatcher& ep) const {
  if (ep.owner_of() != owners_) {  // the group's placement of physical experts on ranks, once
    owners_ = ep.owner_of();
    device_owners_ = backend::to_device(ctx, Tensor::from(owners_, {static_cast<int64_t>(owners_.size())}));
  }
  return device_owners_.data<int32_t>();
}

void Decoder::run_layers(backend::Context& ctx, const ops::StepView& step, KvCache& kv, StepTensors& t) const {
  if (p_.residual_block_size > 0) return run_residual_mix_layers(ctx, step, kv, t);
  ops::cuda::embedding_ids_on_device(ctx, p_.embed, step.token_ids, step.tokens, t.residual);
  // Each residual add runs with the norm after it (ops::cuda::add_rms_norm): one kernel, not two.
  ops::rms_norm(ctx, t.residual, &p_.layers.front().input_norm, p_.rms_eps, t.normed);
  for (std::size_t l = 0; l < p_.layers.size(); ++l) {
    const Layer& layer = p_.layers[l];
    run_attention(ctx, layer, step, kv, static_cast<int64_t>(l), t);
    ops::cuda::add_rms_norm(ctx, t.branch, t.residual, &layer.post_attention_norm, p_.rms_eps, t.normed);
    if (layer.moe) {
      run_moe(ctx, *layer.moe, t.normed, step, t.branch);
    } else {
      layer.dense->forward(ctx, t.normed, t.branch);
    }
    if (l + 1 < p_.layers.size()) {
      ops::cuda::add_rms_norm(ctx, t.branch, t.residual, &p_.layers[l + 1].input_norm, p_.rms_eps, t.normed);
    } else {
      ops::add_rows(ctx, t.branch, nullptr, t.residual);
    }
  }
  ops::cuda::embedding_ids_on_device(ctx, t.residual, step.logit_rows, step.logit_row_count, t.selected);
  ops::rms_norm(ctx, t.selected, &p_.final_norm, p_.rms_eps, t.selected);
  ops::linear(ctx, t.selected, p_.lm_head, nullptr, t.logits);
  ops::cuda::join_side_stream(ctx);  // the layers' L2 prefetches (a graph capture ends joined)
}

namespace {

void count_nodes(cudaGraph_t graph, StepGraphNodes& nodes) {
  std::size_t n = 0;
  R3_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> all(n);
  R3_CUDA_CHECK(cudaGraphGetNodes(graph, all.data(), &n));
  nodes = {};
  for (cudaGraphNode_t node : all) {
    cudaGraphNodeType type{};
    R3_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    ++(type == cudaGraphNodeTypeKernel ? nodes.kernels : type == cudaGraphNodeTypeMemset ? nodes.memsets : nodes.others);
  }
}

}  // namespace

void Decoder::run_layers_graphed(backend::Context& ctx, ops::StepView step, KvCache& kv, StepTensors& t) const {
  // Attention sizes its grid by the step's longest context: in a graph, by a bucket of it (the
  // next power of two from 64, at most the capacity); chunks past a token's window add nothing.
  int64_t bucket = 64;
  while (bucket < step.max_context) bucket *= 2;
  step.max_context = std::min(bucket, std::max(step.max_context, kv.capacity()));
  const GraphKey key{step.tokens, step.logit_row_count, step.max_context, ctx.batch_invariant(), p_.capture_routing,
                     p_.moe_path};
  const int64_t growths = ctx.workspace().growths();
  const cudaStream_t stream = ctx.cuda_state().stream;
  auto found = graphs_.find(key);
  if (found != graphs_.end() && (found->second.residual != t.residual.raw_data() || found->second.growths != growths)) {
    cudaGraphExecDestroy(found->second.exec);  // the workspace moved: capture again
    graphs_.erase(found);
    found = graphs_.end();
  }
  if (found == graphs_.end()) {
    if (seen_.insert(key).second) return run_layers(ctx, step, kv, t);  // first time: eager, sizes the workspace
    cudaGraph_t graph = nullptr;
    R3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      run_layers(ctx, step, kv, t);
    } catch (...) {
      ctx.cuda_state().side_pending = false;  // the failed capture is dropped with its branches
      cudaStreamEndCapture(stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      moe_layers_routed_ = 0;  // the routing kernels were recorded, never run: nothing to deliver
      throw;
    }
    ops::cuda::join_side_stream(ctx);  // whatever path the layers took
    R3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    count_nodes(graph, step_graph_nodes_);
    StepGraph captured;
    const cudaError_t status = cudaGraphInstantiate(&captured.exec, graph, 0);
    cudaGraphDestroy(graph);
    R3_CUDA_CHECK(status);
    captured.residual = t.residual.raw_data();
    captured.growths = ctx.workspace().growths();
    found = graphs_.emplace(key, captured).first;
  }
  R3_CUDA_CHECK(cudaGraphLaunch(found->second.exec, stream));
  ++graph_replays_;
}

void Decoder::prepare(int64_t tokens, const KvCache& kv) const {
  const int64_t table_blocks = (kv.capacity() + kv.block_size() - 1) / kv.block_size();
  const auto moe_layers = static_cast<int64_t>(p_.info.moe_layers.size());
  if (kv.serial() != graphs_cache_serial_) {
    drop_graphs();
    graphs_cache_serial_ = kv.serial();
  }
  if (!steps_ || tokens > step_room_ || kv.max_seqs() > slot_room_ || table_blocks > table_room_) {
    step_room_ = std::max(step_room_, tokens);
    slot_room_ = std::max(slot_room_, kv.max_seqs());
    table_room_ = std::max(table_room_, table_blocks);
    steps_ = std::make_unique<DeviceStepBuilder>(ctx_, step_room_, slot_room_, table_room_, moe_layers, p_.info.top_k);
    drop_graphs();
  }
  if (moe_layers > 0 && (!capture_ || tokens > capture_room_)) {
    capture_room_ = std::max(capture_room_, tokens);
    capture_ = std::make_unique<moe::DeviceCaptureBuffer>(ctx_, capture_room_, moe_layers, p_.info.top_k);
    drop_graphs();
  }
  if (!loads_) {
    int64_t width = 0;
    for (const Layer& layer : p_.layers) {
      const Moe* moe = layer.routed_moe();
      if (moe != nullptr && moe->map) width = std::max(width, moe->map->num_physical());
    }
    if (width > 0) {
      loads_ = std::make_unique<moe::DeviceLoadCounts>(ctx_, moe_layers, width);
      drop_graphs();
    }
  }
}

void Decoder::deliver_routing(const ForwardBatch& batch, int64_t routed_layers) const {
  const int64_t tokens = batch.size(), k = p_.info.top_k;
  const auto moe_layers = static_cast<int64_t>(p_.info.moe_layers.size());
  const std::span<const int32_t> rows = capture_->collect();             // [tokens, layers, k]
  const std::span<const float> weights = capture_->collected_weights();  // [layers, tokens, k]
  const std::span<const float> margins = capture_->collected_margins();  // [tokens, layers]
  R3_CHECK(batch.capture != nullptr, "forward: MoE layers need the step's capture buffer");
  batch.capture->record_layers(routed_layers, moe_layers, tokens, k, rows, weights, margins);
  if (batch.loads == nullptr || loads_) return;  // with EPLB the device map counted
  for (int64_t j = 0; j < routed_layers; ++j) {
    const std::span<int64_t> counts = batch.loads->layer(j);  // no EPLB: physical = logical
    for (int64_t t = 0; t < tokens; ++t) {
      if (batch.seqs[t] == ForwardBatch::kPadding) continue;
      const int32_t* row = rows.data() + (t * moe_layers + j) * k;
      for (int64_t c = 0; c < k; ++c) ++counts[static_cast<std::size_t>(row[c])];
    }
  }
}

void Decoder::deliver_loads(const ForwardBatch& batch) const {
  if (batch.loads == nullptr) return;
  const std::span<const int32_t> counted = loads_->collect();  // [moe_layers, width]
  for (int64_t j = 0; j < batch.loads->num_layers(); ++j) {
    const std::span<int64_t> counts = batch.loads->layer(j);
    R3_CHECK(static_cast<int64_t>(counts.size()) <= loads_->width(), "EPLB (cuda): layer ", j, " has ", counts.size(),
             " physical experts, the device counted ", loads_->width());
    for (std::size_t p = 0; p < counts.size(); ++p) {
      counts[p] += counted[static_cast<std::size_t>(j * loads_->width()) + p];
    }
  }
}

}  // namespace device

void set_capture_routing(CausalLM& model, bool on) {
  auto* decoder = dynamic_cast<device::Decoder*>(&model);
  R3_CHECK(decoder != nullptr, "capture on/off: not a device model");
  decoder->set_capture_routing(on);
}

void set_moe_path(CausalLM& model, moe::MoePath path) {
  auto* decoder = dynamic_cast<device::Decoder*>(&model);
  R3_CHECK(decoder != nullptr, "--moe-path: not a device model");
  decoder->set_moe_path(path);
}

int64_t graph_replays(const CausalLM& model) {
  const auto* decoder = dynamic_cast<const device::Decoder*>(&model);
  return decoder != nullptr ? decoder->graph_replays() : 0;
}

StepGraphNodes step_graph_nodes(const CausalLM& model) {
  const auto* decoder = dynamic_cast<const device::Decoder*>(&model);
  return decoder != nullptr ? decoder->step_graph_nodes() : StepGraphNodes{};
}

namespace device {

void check_device_moe_path(moe::MoePath path) {
  R3_CHECK(path != moe::MoePath::kMonolithicNoCapture, "--moe-path ", moe::moe_path_name(path),
           ": the GPU runs mega, modular or monolithic (every GPU path captures)");
}

}  // namespace device

std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model, DType weights,
                                          moe::MoePath moe_path, moe::ExpertSlice experts) {
  R3_CHECK(ctx.device() == Device::kCuda, "place_on_device: not a CUDA context");
  R3_CHECK(weights == DType::F32 || weights == DType::BF16, "--dtype: float32 or bfloat16 weights on the GPU, not ",
           dtype_name(weights));
  device::check_device_moe_path(moe_path);
  if (auto* k3 = dynamic_cast<KimiK3Model*>(model.get())) {
    model.release();
    return device::place_kimi_k3(ctx, std::unique_ptr<KimiK3Model>(k3), weights, moe_path, experts);
  }
  auto* decoder = dynamic_cast<DecoderModel*>(model.get());
  R3_CHECK(decoder != nullptr, "--device cuda: ", model->info().architecture,
           " has no CUDA kernels yet (DeepSeek-V4's compressed attention comes in a later release); use --device cpu");
  model.release();
  std::unique_ptr<DecoderModel> host(decoder);
  device::DecoderParts parts;
  parts.info = host->info();
  parts.rms_eps = host->rms_eps();
  parts.cache_specs = host->cache_specs();
  parts.kv_dtype = weights;
  parts.reduced_precision = weights == DType::BF16;
  parts.moe_path = moe_path;
  parts.embed = on_device(ctx, host->embed(), weights);  // the lookup widens it exactly
  parts.final_norm = on_device(ctx, host->final_norm(), DType::F32);
  const bool tied = host->lm_head().raw_data() == host->embed().raw_data();
  parts.lm_head = tied ? parts.embed : on_device(ctx, host->lm_head(), weights);
  for (std::size_t l = 0; l < host->layers().size(); ++l) {
    const DecoderLayer& layer = host->layers()[l];
    device::Layer d;
    d.input_norm = on_device(ctx, layer.input_norm, DType::F32);
    d.post_attention_norm = on_device(ctx, layer.post_attention_norm, DType::F32);
    d.attention = layer.attention->placed(ctx, weights);
    if (const auto* dense = dynamic_cast<const DenseFeedForward*>(layer.feed_forward.get())) {
      d.dense.emplace(mlp_on_device(ctx, dense->mlp(), weights));
    } else {
      const auto* moe = dynamic_cast<const MoeFeedForward*>(layer.feed_forward.get());
      R3_CHECK(moe != nullptr, "--device cuda: layer ", l, "'s feed-forward has no CUDA kernels");
      d.moe.emplace(ctx, *moe, weights, host->eplb_options().active(), experts);
    }
    parts.layers.push_back(std::move(d));
  }
  const moe::EplbOptions eplb = host->eplb_options();
  parts.host = std::move(host);
  auto placed = std::make_unique<device::Decoder>(ctx, std::move(parts));
  placed->set_eplb_options(eplb);  // the engine's load windows and rebalancing run over the host's blocks
  return placed;
}

}  // namespace r3::models
