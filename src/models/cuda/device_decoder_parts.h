// The pieces of a decoder on a CUDA device (models/device_decoder.h): each layer's weights in
// device memory with its forward step, and the model that runs them. Made from a loaded host
// model (device_decoder.cpp) or from random weights at a given shape (synthetic_decoder.cpp).
// Internal to models/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "backend/context.h"
#include "models/decoder_model.h"
#include "models/device_decoder.h"
#include "models/kimi_k3/attention_residual.h"
#include "models/kimi_k3/kimi_k3_model.h"
#include "models/kimi_k3/latent_moe.h"
#include "models/kimi_k3/situ_mlp.h"
#include "models/device_step_builder.h"
#include "models/weights_on_device.h"
#include "moe/device_capture.h"
#include "moe/device_expert_map.h"
#include "moe/device_experts.h"
#include "moe/device_monolithic_moe.h"
#include "moe/moe_path.h"
#include "moe/device_routing.h"
#include "moe/ep/expert_parallel_dispatcher.h"
#include "core/function_ref.h"
#include "ops/cuda/token_drawer.h"
#include "ops/step_view.h"

namespace r3::models::device {

struct Moe {
  int64_t layer_id = 0;
  int64_t num_experts = 0, top_k = 0;
  Tensor gate_weight, gate_bias, correction_bias;
  moe::DeviceRoutingRule rule;
  mutable moe::DeviceExperts experts;  // the physical experts (replicas included); follow_placement rewrites them
  DType dtype = DType::F32;
  std::optional<SwigluMlp> shared_expert;
  Tensor shared_gate;
  // EPLB (replicas or rebalancing): the host layer's experts, whose placement the device copies
  // follow, and the map from logical to physical ids on the device. Null map: no EPLB, the
  // experts are the logical ones. held_placement: the placement `experts` hold (that of the host
  // layer's placement_version).
  const moe::PhysicalExperts* host_experts = nullptr;
  std::shared_ptr<moe::DeviceExpertMap> map;
  mutable int64_t placement_version = 0;
  mutable std::optional<moe::ExpertPlacement> held_placement;
  std::shared_ptr<moe::MonolithicMoeSync> monolithic_sync;  // the monolithic kernel's counters for this layer

  // The layer's physical experts; `experts` holds them all, or on an expert-parallel rank only its
  // slice (experts.first on), which only the expert-parallel path runs.
  int64_t physical_experts = 0;

  Moe() = default;
  Moe(backend::Context& ctx, const MoeFeedForward& host, DType dtype, bool eplb, moe::ExpertSlice slice = {});
  // The block's routing and experts only (no shared expert).
  Moe(backend::Context& ctx, const moe::MoeBlock& block, DType dtype, bool eplb, moe::ExpertSlice slice = {});
  // Whether `experts` holds every physical expert (the one-rank paths need them all).
  bool holds_every_expert() const { return experts.first == 0 && experts.gate.dim(0) == physical_experts; }
  // Gate GEMM, then routing fused with the capture write (the ids reach `capture` rows in the
  // same kernel that writes them to `ids`; null rows: not captured). ids: device [tokens, k]
  // logical ids; weights: device [tokens, k]. Returns them as the captured routing.
  moe::DeviceCapturedRouting route(backend::Context& ctx, const Tensor& x, const ops::StepView& step, int32_t* ids,
                                   float* weights, moe::DeviceCaptureRows capture) const;
  // The EPLB map (when on: logical ids to physical ones, counting into `load_counts`, device
  // [num_physical] or null), then the fused experts (always_grouped: the modular path's kernels
  // at every step size) and the shared expert.
  void run_experts(backend::Context& ctx, const Tensor& x, const ops::StepView& step,
                   const moe::DeviceCapturedRouting& captured, int32_t* load_counts, Tensor& out,
                   bool always_grouped) const;
  // Expert parallelism (an eager step): the EPLB map as run_experts runs it, then the pairs
  // planned, packed and exchanged through ep's device exchange for the ranks holding their
  // physical experts (owner_of: device [num_physical]), this rank's experts over
  // the rows that came, the outputs back and the combine (moe/device_ep_dispatch.h); then the
  // shared expert. Waits once, for the counts the exchanges are sized by.
  void run_experts_over_gpus(backend::Context& ctx, const Tensor& x, const ops::StepView& step,
                             const moe::DeviceCapturedRouting& captured, int32_t* load_counts,
                             const moe::ep::ExpertParallelDispatcher& ep, const int32_t* owner_of, Tensor& out) const;
  // Whether a step of `tokens` tokens can run the whole layer as one monolithic kernel
  // (moe/device_monolithic_moe.h): a few tokens, and no map a test replaced.
  bool monolithic_fits(int64_t tokens) const { return !host_map() && moe::monolithic_moe_fits(experts, tokens); }
  // route and run_experts as one monolithic kernel (then the shared expert): the same ids, weights,
  // capture rows, load counts and output, with the same bits.
  // experts_x: the experts' input when it is not x (Kimi K3's latent rows), or null.
  void route_and_run_experts(backend::Context& ctx, const Tensor& x, const ops::StepView& step, int32_t* ids,
                             float* weights, moe::DeviceCaptureRows capture, int32_t* load_counts, Tensor& out,
                             const Tensor* experts_x = nullptr) const;
  // Brings the device experts and map up to the host layer's placement after a rebalance
  // (between steps; the device addresses stay, so recorded graphs stay valid): only the slots
  // whose expert changed take weights, from slots that held it, device to device
  // (moe/ep/device_expert_moves.h). Under expert parallelism (ep: the step's dispatcher) a
  // collective over its device exchange: every rank follows each layer in the same order.
  void follow_placement(backend::Context& ctx, const moe::ep::ExpertParallelDispatcher* ep) const;
  // The captured routing as the experts take it: through the EPLB map when on (counting into
  // load_counts; the physical ids in ctx's workspace), else its own ids.
  moe::DevicePhysicalRouting physical_routing(backend::Context& ctx, const ops::StepView& step,
                                              const moe::DeviceCapturedRouting& captured, int32_t* load_counts) const;
  // Whether a test replaced the host layer's map function: the map then runs on the host (eagerly),
  // with or without EPLB, as the CPU paths run it.
  // (A synthetic model has no host layer.)
  bool host_map() const { return host_experts != nullptr && host_experts->has_map_function(); }
};

// Kimi K3's latent MoE (LatentMoeFeedForward): routed on the hidden state, its experts run in
// the latent width between `down` and rms_norm + `up`; the shared experts at full width.
struct LatentMoe {
  Moe moe;  // no shared expert: `shared` is
  Tensor down, norm, up;
  float rms_eps;
  SituMlp shared;

  LatentMoe(backend::Context& ctx, const LatentMoeFeedForward& host, DType dtype, bool eplb, moe::ExpertSlice slice = {});
};

// One of Kimi K3's attention-residual mixes with its weights on the device (AttentionResidual's
// mix runs wherever its context does).
AttentionResidual residual_on_device(backend::Context& ctx, const AttentionResidual& host);

// A host SiTU MLP with its matrices on the device as `dtype` (SituMlp's forward runs wherever
// its context does).
SituMlp situ_on_device(backend::Context& ctx, const SituMlp& host, DType dtype);

struct Layer {
  Tensor input_norm, post_attention_norm;
  // Grouped-query, latent or Kimi Delta Attention: the host class with its weights on the device.
  std::unique_ptr<AttentionLayer> attention;
  std::optional<SwigluMlp> dense;
  std::optional<Moe> moe;
  // Kimi K3 (DecoderParts::residual_block_size > 0): its feed-forward is one of these two, and
  // its input and its MLP's input are mixed from the block snapshots.
  std::optional<SituMlp> situ;
  std::optional<LatentMoe> latent_moe;
  std::optional<AttentionResidual> pre_mix, post_mix;

  // The layer's routed experts (its MoE's or its latent MoE's), or null for a dense layer.
  const Moe* routed_moe() const { return moe ? &*moe : latent_moe ? &latent_moe->moe : nullptr; }
};


// The MoE paths the GPU runs: mega, modular and monolithic; throws for monolithic-nocapture.
void check_device_moe_path(moe::MoePath path);

// What a decoder on the device is made of; `host` is the model it was copied from (kept alive
// for its checkpoint mapping and MoE blocks), or null for random weights.
struct DecoderParts {
  ModelInfo info;
  float rms_eps = 0;
  std::vector<CacheSpec> cache_specs;
  Tensor embed, final_norm, lm_head;
  std::vector<Layer> layers;
  std::unique_ptr<CausalLM> host;
  // > 0: Kimi K3's attention residuals over blocks of this many layers (Layer::pre_mix, post_mix,
  // and output_mix before the final norm) instead of one running residual sum.
  int64_t residual_block_size = 0;
  std::optional<AttentionResidual> output_mix;
  // False: the routing kernels write no capture rows and nothing is copied back (benchmarks measure
  // capture's cost with it; a model the engine runs always captures).
  bool capture_routing = true;
  // The KV pools' element type: the weights' (a bf16 model keeps bf16 keys and values, as its
  // projections produce them at that precision; float32 for parity runs).
  DType kv_dtype = DType::F32;
  // Placed for bfloat16 (--dtype bfloat16): its steps run with Context::reduced_precision, so
  // quantized projections and experts may take the tensor cores as bfloat16 ones do (float32:
  // parity runs).
  bool reduced_precision = false;
  // How MoE layers run (--moe-path), all with the same bits: kMega (the default: routing with
  // capture, then the fused experts, pair by pair for decode steps of a few tokens), kModular
  // (router, routing, grouping by expert, grouped experts and combine as separate kernels at
  // every size) or kMonolithic (decode steps of a few tokens as one kernel a layer, else kMega).
  moe::MoePath moe_path = moe::MoePath::kMega;
};



class Decoder final : public CausalLM {
 public:
  Decoder(backend::Context& ctx, DecoderParts parts);
  ~Decoder() override;

  const ModelInfo& info() const override { return p_.info; }
  std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const override;
  std::unique_ptr<ModelCache> make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                               int64_t block_size) const override;
  // The host model's MoE blocks (capture binding); none for random weights.
  std::vector<moe::MoeBlock*> moe_blocks() override;
  void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                    Tensor& logits) const override;
  // The logits stay on the device: the draws run there and only their results come back.
  bool draws_tokens() const override { return true; }
  void forward_drawn(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                     std::span<const ops::TokenDraw> draws, std::span<ops::DrawnToken> drawn) const override;
  int64_t graph_replays() const { return graph_replays_; }
  StepGraphNodes step_graph_nodes() const { return step_graph_nodes_; }
  void set_capture_routing(bool on) { p_.capture_routing = on; }
  void set_moe_path(moe::MoePath path) {
    check_device_moe_path(path);
    p_.moe_path = path;
  }

 private:
  // The device tensors of a step that outlive its layers; taken first from the step's workspace
  // scope, so a step of the same shape gets the same addresses.
  struct StepTensors {
    Tensor residual, normed, branch, selected, logits;
  };
  // Steps replayed as one CUDA graph, by (tokens, logit rows, context bucket, batch invariance
  // of the context, which picks some kernels, capture on or off, the MoE path): the step's kernels
  // read everything that changes from one step to the next (token ids, positions, block tables,
  // the KV pools) through fixed device addresses, so one capture serves every later step of that
  // shape. A shape is captured the second time it is seen (the first run, eager, sizes the
  // workspace), and again whenever the workspace has moved its memory since. A graph also holds
  // the addresses of the KV pools, the step builder's buffer and the capture buffer: all graphs
  // are dropped when a step runs on another cache or either buffer is rebuilt larger (prepare).
  using GraphKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, moe::MoePath>;
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    const void* residual = nullptr;  // where the step's tensors were when it was captured
    int64_t growths = 0;             // the workspace's growth count then
  };
  // A whole step: its metadata, the layers (graphed when it can), then `finish` with the device
  // logits (which waits for the stream: the step's one wait), then the routing to the host and
  // the cache lengths.
  void run_step(backend::Context& ctx, const ForwardBatch& batch, ModelCache& model_cache,
                FunctionRef<void(const Tensor& logits)> finish) const;
  // Embedding, layers, final norm and lm_head: the part of a step a graph holds.
  void run_layers(backend::Context& ctx, const ops::StepView& step, KvCache& kv, StepTensors& t) const;
  // The same for Kimi K3's attention residuals (models/cuda/kimi_k3_on_device.cpp).
  void run_residual_mix_layers(backend::Context& ctx, const ops::StepView& step, KvCache& kv, StepTensors& t) const;
  // Layer l's attention from t.normed into t.branch.
  void run_attention(backend::Context& ctx, const Layer& layer, const ops::StepView& step, KvCache& kv, int64_t l,
                     StepTensors& t) const;
  // A MoE layer's gate and routing with the capture write: its logical ids (scratch of the
  // caller's workspace scope) and weights (in the capture buffer), and its load counts (EPLB).
  struct Routed {
    moe::DeviceCapturedRouting captured;
    int32_t* loads;
  };
  Routed route(backend::Context& ctx, const Moe& moe, const Tensor& normed, const ops::StepView& step) const;
  // The running step's expert-parallel dispatcher (null on one rank).
  const moe::ep::ExpertParallelDispatcher* ep_dispatcher() const;
  // The expert-parallel group's owner_of on the device (uploaded when it changes).
  const int32_t* device_owners(backend::Context& ctx, const moe::ep::ExpertParallelDispatcher& ep) const;
  // A MoE layer's routed experts from `normed` into `out` (the shared expert added), by the
  // placement's MoE path: route, then run_experts, or both in one monolithic kernel; under expert
  // parallelism, route, then the experts over the ranks through the dispatcher's device exchange.
  // experts_in: the experts' input when it is not `normed` (Kimi K3's latent rows), or null.
  void run_moe(backend::Context& ctx, const Moe& moe, const Tensor& normed, const ops::StepView& step, Tensor& out,
               const Tensor* experts_in = nullptr) const;
  // run_layers, from a graph of this step's shape when there is one (capturing it when due).
  void run_layers_graphed(backend::Context& ctx, ops::StepView step, KvCache& kv, StepTensors& t) const;
  // Sizes the step builder and the capture buffer for a step of `tokens` tokens over the cache's
  // slots (they only grow, so a warmed-up engine allocates nothing here).
  void prepare(int64_t tokens, const KvCache& kv) const;
  void drop_graphs() const;
  // The captured rows of the first `moe_layers` MoE layers to the step's host capture buffer
  // (what the routing kernel wrote, which is what the experts ran with; all layers in one pass),
  // and each layer's tokens per expert to the step's loads. A step that failed delivers the
  // layers it routed.
  void deliver_routing(const ForwardBatch& batch, int64_t moe_layers) const;
  // Each layer's tokens per physical expert, as the device map counted them, to the step's loads.
  void deliver_loads(const ForwardBatch& batch) const;

  backend::Context& ctx_;
  DecoderParts p_;
  mutable std::unique_ptr<DeviceStepBuilder> steps_;
  mutable std::unique_ptr<moe::DeviceCaptureBuffer> capture_;
  mutable int64_t step_room_ = 0, slot_room_ = 0, table_room_ = 0, capture_room_ = 0;
  mutable std::map<GraphKey, StepGraph> graphs_;
  mutable std::set<GraphKey> seen_;
  mutable uint64_t graphs_cache_serial_ = 0;  // KvCache::serial() of the cache the graphs were recorded on
  mutable int64_t graph_replays_ = 0;
  mutable StepGraphNodes step_graph_nodes_;  // of the last graph captured
  mutable std::unique_ptr<moe::DeviceLoadCounts> loads_;  // EPLB on: each step's loads
  mutable int64_t moe_layers_routed_ = 0;                  // of the running step, for a failed one
  // Expert parallelism: the running step's dispatcher (ForwardBatch::dispatcher; null on one
  // rank).
  mutable const moe::Dispatcher* dispatcher_ = nullptr;
  mutable std::vector<int32_t> owners_;  // the physical experts' ranks, and their copy on the device
  mutable Tensor device_owners_;
  mutable ops::cuda::TokenDrawer drawer_;
  bool has_recurrent_layers_ = false;  // Kimi Delta Attention layers: steps are checked for their runs
};

// Kimi K3 on the device (models/cuda/kimi_k3_on_device.cpp).
std::unique_ptr<CausalLM> place_kimi_k3(backend::Context& ctx, std::unique_ptr<KimiK3Model> host, DType weights,
                                        moe::MoePath moe_path, moe::ExpertSlice experts = {});

}  // namespace r3::models::device
