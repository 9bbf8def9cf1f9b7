// A loaded decoder placed on a CUDA device: its weights copied to device memory, its KV caches
// made there, and every step run by the CUDA kernels, with the routed experts captured on the
// device by the routing kernel itself (moe/device_routing.h) before the experts run.
//
// The host model stays the source of truth: the device copy is made from it, keeps it alive
// (checkpoint mapping, MoE blocks for capture binding), and reports its info and MoE layers. A
// step's host work is building its metadata (one asynchronous upload, models/device_step_builder.h);
// the host waits once, for the logits, then collects the captured rows from pinned memory.
//
// Weights: the projections and experts as `weights` — float32 (the parity mode: widened exactly,
// and dense GEMMs through cuBLASLt in float32) or bfloat16 (rounded to nearest where stored wider;
// r3's weight-streaming kernels widen them in registers). Embedding, norms, biases, sinks and
// router gates stay float32; activations are float32 in both modes. What has no device kernels
// yet is refused by name when the model is placed: DeepSeek-V4 (a model class of its own), and
// Kimi Delta Attention heads wider than its kernel holds. Kimi K3, also a class of its own, is
// placed as a decoder with its attention-residual layer loop.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "backend/context.h"
#include "models/causal_lm.h"
#include "moe/device_experts.h"
#include "moe/moe_path.h"

namespace r3::models {

// `model` on ctx's CUDA device (ctx must outlive the result). Throws r3::Error for what the CUDA
// backend cannot run yet, or when this build has no CUDA backend. moe_path: how its MoE layers
// run (--moe-path), every path with the same bits: kMega (the default: the routing kernel with
// its capture write, then the fused experts taking the ids: pair by pair in two kernels for a
// decode step of up to 4 tokens, grouped by expert above), kModular (router, routing, grouping
// by expert, grouped experts and combine as separate kernels at every size) or kMonolithic (a
// decode step of up to 4 tokens runs each MoE layer as one kernel, moe/device_monolithic_moe.h;
// measured slower than kMega). kMonolithicNoCapture is refused.
// experts: the physical experts each MoE layer holds on the device, all of them unless an
// expert-parallel rank places only its slice (moe::ExpertSlice; such a model runs only as that
// rank, and not with EPLB).
std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model,
                                          DType weights = DType::BF16, moe::MoePath moe_path = moe::MoePath::kMega,
                                          moe::ExpertSlice experts = {});

// Switches a device model's MoE path between steps (benchmarks compare both on one model).
// Throws for other models and for a path the GPU does not run.
void set_moe_path(CausalLM& model, moe::MoePath path);

// How many steps of a device model ran as one CUDA graph launch (everything from the embedding to
// lm_head, routing capture included); 0 for any other model.
int64_t graph_replays(const CausalLM& model);

// The nodes of the last step graph a device model captured, by kind. A step should be kernels
// only: a memset or copy between two kernels ends their programmatic launch (the kernel after it
// starts only once the node is done, not while the kernel before drains). Zeros for any other model.
struct StepGraphNodes {
  int64_t kernels = 0, memsets = 0, others = 0;
};
StepGraphNodes step_graph_nodes(const CausalLM& model);

// Turns a device model's routing capture off or on between steps (benchmarks measure its cost on
// one model, interleaving steps with and without it); with it off, the routing kernels write no
// capture rows, nothing is copied back and steps deliver no routing. Throws for other models.
void set_capture_routing(CausalLM& model, bool on);

// A decoder with random weights made on the device, for benchmarks at real shapes without a
// checkpoint: Qwen3-MoE's architecture (grouped-query attention with per-head q/k norms, rotary
// theta 1e6, softmax top-k routing renormalised, SwiGLU experts, every layer MoE, untied lm_head),
// bf16 projections and experts, float32 norms and router gates.
struct SyntheticShape {
  int64_t layers = 48, hidden = 2048, heads = 32, kv_heads = 4, head_dim = 128;
  int64_t experts = 128, top_k = 8, expert_width = 768, vocab = 151936;
  // The attention and expert matrices as FP8 e4m3 with a float32 scale per 128x128 block (how
  // Qwen3-30B-A3B-FP8 is published); the embedding and lm_head stay bf16, the router float32.
  bool fp8 = false;
  static constexpr int64_t kFp8Block = 128;
  // "qwen3-30b-a3b" (the defaults); throws listing the names it knows.
  static SyntheticShape named(std::string_view name);
  // Bytes of one [rows, cols] attention or expert matrix: bf16, or FP8 values and their scales.
  int64_t matrix_bytes(int64_t rows, int64_t cols) const;
  // Bytes of the weights (those matrices, bf16 embedding and lm_head, f32 norms and gates).
  int64_t weight_bytes() const;
  // Bytes of the bf16 keys and values of `sequences` sequences of `positions` positions each,
  // over every layer (the device KV cache a decode step of that size needs).
  int64_t kv_cache_bytes(int64_t sequences, int64_t positions) const;
};
// Positions of KV cache a sequence of the synthetic benchmark's decode steps gets beyond their
// context.
inline constexpr int64_t kSyntheticSparePositions = 16;
// Device memory a benchmark step needs beside its KV cache (logits, scratch, graphs), kept free.
inline constexpr int64_t kSyntheticStepMargin = int64_t{2} << 30;
// The benchmark's decode batches split into those whose KV cache (context +
// kSyntheticSparePositions positions a sequence) and kSyntheticStepMargin fit in free_bytes, and
// those that do not, each in the given order.
struct BatchesThatFit {
  std::vector<int64_t> run, skipped;
};
BatchesThatFit batches_that_fit(const SyntheticShape& shape, const std::vector<int64_t>& batches, int64_t context,
                                int64_t free_bytes);

// capture_routing = false: the routing kernels write no capture rows and nothing is copied back
// (to measure what capture costs; such a model's steps deliver no routing).
std::unique_ptr<CausalLM> synthetic_on_device(backend::Context& ctx, const SyntheticShape& shape, uint64_t seed = 1,
                                              bool capture_routing = true);

}  // namespace r3::models
