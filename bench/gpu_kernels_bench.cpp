// GPU kernel timings against the bandwidth floor, at the shape of the benchmark model
// (Qwen3-30B-A3B: hidden 2048, 128 experts of intermediate 768, top-8; 32 query heads and 4 KV
// heads of 128). Run on the GPU machine by bench/gpu.sh; one JSON line per measurement.
//
// - moe_layer: routing with capture + fused experts for one MoE layer, bf16 or FP8 expert weights,
//   at batch 1, 8 and 64, as a bfloat16 model's step runs them (reduced precision). Bytes: the distinct experts the batch routed to (measured from the
//   routing) times one expert's weights; floor = bytes / kCopyBandwidth (the H200's measured
//   copy bandwidth, the yardstick).
// - attention: paged GQA decode over a 1024-token context per sequence, float32 cache, at batch
//   1, 8 and 64. Bytes: every sequence's keys and values for one layer.
// - linear: the step's dense projections (q, k and v fused as the decoder runs them, and apart;
//   q/k/v and o also as FP8 with 128x128 block scales; ops::linear: weight-streaming rows for a few rows,
//   cuBLASLt on split bfloat16 for more), bf16 weights (the router's float32), at batch 1, 8, 64
//   and 256. Bytes: the weights plus the float32 activations in and out.
// - moe_layer_paths: one whole MoE layer from its hidden rows (router included) on the modular
//   path's kernels, on the mega path's (routing, then the fused experts pair by pair) and as one
//   monolithic kernel, at 1 and 4 tokens.
// - draws: a step's token draws from [rows, 151936] logits (temperature 1, the chosen token's
//   logprob: an RL rollout's), as TokenDrawer::draw runs them (parameters up, kernels, results
//   down, one wait), spread over the GPU for up to 16 rows and on one block per row, at 1, 8,
//   16 and 64 rows.
// - graph_kernel_gap: the time per kernel of a CUDA graph of trivial kernels (bench/launch_gap.cu),
//   what each kernel boundary of a decode step costs at least.
// - in_graph: a batch-1 step's small ops (add + RMSNorm, prepare, attention, router, routing),
//   each timed among 32 copies of itself in one CUDA graph (bench/in_graph_ops.cpp): what each
//   adds to a decode step's graph, next to graph_kernel_gap's empty kernel.
// - projection_in_graph: q/k/v, o (bf16 and FP8) and the router at 1 and 8 rows, each among 32
//   copies of itself in one graph cycling over weight buffers larger than L2
//   (bench/projections_in_graph.cpp): the projections' rate from memory inside a step's graph.
// - stage_chain: a batch-1 decode layer's chain of stages (what each streams, small stages as one
//   block) without r3's arithmetic, 48 layers, as a kernel a stage in a graph, as one persistent
//   kernel with grid barriers, the same loading the next stage's first bytes before each
//   barrier, both with the small stages folded into the streaming stages after them, and the
//   kernels overlapped as r3's are (kernels_early) (bench/stage_chain.cu): what the structure
//   costs apart from the kernels. The persistent kernels with as many blocks as fit and with 1,
//   2 and 4 an SM (`blocks`: the grid). All with the projections' weights as bfloat16 and as
//   FP8 (`weights`: half their bytes).
// Each measurement: 5 warm-up calls, then the mean of 50 timed with CUDA events; those made in a
// graph (graph_kernel_gap, in_graph, stage_chain): one eager call, the graph launched twice, then
// the mean of 10 launches (gpu_event_timer.h).
#include <cuda_runtime.h>

#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/context.h"
#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "moe/device_capture.h"
#include "moe/cuda/fused_experts_of_ids.h"
#include "moe/device_experts.h"
#include "moe/device_monolithic_moe.h"
#include "moe/device_routing.h"
#include "ops/attention.h"
#include "ops/cuda/token_drawer.h"
#include "ops/linear.h"
#include "bench_tensors.h"
#include "gpu_event_timer.h"
#include "in_graph_ops.h"
#include "projections_in_graph.h"
#include "launch_gap.h"
#include "stage_chain.h"

namespace r3 {
namespace {

constexpr double kCopyBandwidth = 4.26e12;  // bytes/s, H200 copy bandwidth measured for the issue

using bench::fp8_scales_host;
using bench::mean_ms;
using bench::random_fp8_host;
using bench::random_host;

// Run as a bfloat16 model's step runs its MoE layers (reduced precision: tensor cores for FP8
// and bf16 experts at batch 8 and up); without it, batch 8 and up would measure the CUDA-core path
// a float32 model takes.
void moe_layer(backend::Context& gpu, bool fp8) {
  const backend::ReducedPrecisionScope bf16_model(gpu, true);
  const int64_t h = 2048, inter = 768, experts = 128, k = 8;
  moe::DeviceExperts dev;
  if (fp8) {
    dev.gate = backend::to_device(gpu, random_fp8_host({experts, inter, h}, 1));
    dev.up = backend::to_device(gpu, random_fp8_host({experts, inter, h}, 2));
    dev.down = backend::to_device(gpu, random_fp8_host({experts, h, inter}, 3));
    dev.gate_scales = backend::to_device(gpu, fp8_scales_host({experts, inter, h}, 1e-4f));
    dev.up_scales = backend::to_device(gpu, fp8_scales_host({experts, inter, h}, 1e-4f));
    dev.down_scales = backend::to_device(gpu, fp8_scales_host({experts, h, inter}, 1e-4f));
    dev.block_rows = dev.block_cols = 128;
  } else {
    dev.gate = backend::to_device(gpu, random_host(DType::BF16, {experts, inter, h}, 1, 0.02f));
    dev.up = backend::to_device(gpu, random_host(DType::BF16, {experts, inter, h}, 2, 0.02f));
    dev.down = backend::to_device(gpu, random_host(DType::BF16, {experts, h, inter}, 3, 0.02f));
  }
  const double expert_bytes = 3.0 * static_cast<double>(inter * h) * (fp8 ? 1 : 2);
  moe::DeviceCaptureBuffer capture(gpu, 256, 1, k);
  const moe::DeviceRoutingRule rule{moe::DeviceRoutingRule::Kind::kSoftmaxTopK, static_cast<int32_t>(k), true};
  for (const int64_t batch : {1, 8, 64, 256}) {
    const Tensor x = backend::to_device(gpu, random_host(DType::F32, {batch, h}, 4, 1.0f));
    const Tensor logits = backend::to_device(gpu, random_host(DType::F32, {batch, experts}, 5, 1.0f));
    Tensor ids = backend::device_empty(gpu, DType::I32, {batch, k}), weights = backend::device_empty(gpu, DType::F32, {batch, k});
    Tensor grouping = backend::device_empty(gpu, DType::I32, {moe::grouping_ints(experts, batch * k)});
    Tensor activated = backend::device_empty(gpu, DType::F32, {moe::expert_scratch_rows(batch * k), inter});
    Tensor expert_out = backend::device_empty(gpu, DType::F32, {moe::expert_scratch_rows(batch * k), h});
    Tensor out = backend::device_empty(gpu, DType::F32, {batch, h});
    const double ms = mean_ms(gpu, [&] {
      moe::route_on_device(gpu, logits, rule, nullptr, nullptr, ids.data<int32_t>(), weights.data<float>(),
                           capture.layer_rows(0));
      moe::fused_experts_of_ids(gpu, x, ids.data<int32_t>(), weights.data<float>(), k, dev, grouping, activated, expert_out, out);
    });
    const double route_ms = mean_ms(gpu, [&] {
      moe::route_on_device(gpu, logits, rule, nullptr, nullptr, ids.data<int32_t>(), weights.data<float>(),
                           capture.layer_rows(0));
    });
    const Tensor host_ids = backend::to_host(gpu, ids);
    const std::set<int32_t> distinct(host_ids.data<int32_t>(), host_ids.data<int32_t>() + batch * k);
    const double bytes = static_cast<double>(distinct.size()) * expert_bytes;
    const double floor_ms = bytes / kCopyBandwidth * 1e3;
    std::printf("{\"bench\":\"moe_layer\",\"weights\":\"%s\",\"batch\":%lld,\"distinct_experts\":%zu,\"MB\":%.1f,"
                "\"ms\":%.4f,\"routing_with_capture_ms\":%.4f,\"floor_ms\":%.4f,\"of_floor\":%.3f}\n",
                fp8 ? "fp8" : "bf16", static_cast<long long>(batch), distinct.size(), bytes / 1e6, ms, route_ms, floor_ms, floor_ms / ms);
  }
  // The whole layer from the hidden rows (router projection included) on the three MoE paths, at
  // the decode sizes the monolithic kernel takes: the modular path's kernels (router GEMV,
  // routing, grouping, grouped experts, combine), the mega path's (router GEMV, routing, gate/up
  // and down + combine pair by pair) and one monolithic launch.
  const Tensor router = backend::to_device(gpu, random_host(DType::F32, {experts, h}, 9, 0.05f));
  moe::MonolithicMoeSync sync(gpu);
  for (const int64_t batch : {int64_t{1}, moe::kPairMajorTokens}) {
    const Tensor x = backend::to_device(gpu, random_host(DType::F32, {batch, h}, 4, 1.0f));
    Tensor logits = backend::device_empty(gpu, DType::F32, {batch, experts});
    Tensor ids = backend::device_empty(gpu, DType::I32, {batch, k}), weights = backend::device_empty(gpu, DType::F32, {batch, k});
    Tensor grouping = backend::device_empty(gpu, DType::I32, {moe::grouping_ints(experts, batch * k)});
    Tensor activated = backend::device_empty(gpu, DType::F32, {moe::expert_scratch_rows(batch * k), inter});
    Tensor expert_out = backend::device_empty(gpu, DType::F32, {moe::expert_scratch_rows(batch * k), h});
    Tensor out = backend::device_empty(gpu, DType::F32, {batch, h});
    Tensor scratch = backend::device_empty(gpu, DType::F32, {moe::monolithic_moe_scratch_floats(dev, batch, experts, k)});
    const double modular_ms = mean_ms(gpu, [&] {
      ops::linear(gpu, x, router, nullptr, logits);
      moe::route_on_device(gpu, logits, rule, nullptr, nullptr, ids.data<int32_t>(), weights.data<float>(),
                           capture.layer_rows(0));
      moe::fused_experts_of_ids(gpu, x, ids.data<int32_t>(), weights.data<float>(), k, dev, grouping, activated,
                                   expert_out, out, /*always_grouped=*/true);
    });
    const double mega_ms = mean_ms(gpu, [&] {
      ops::linear(gpu, x, router, nullptr, logits);
      moe::route_on_device(gpu, logits, rule, nullptr, nullptr, ids.data<int32_t>(), weights.data<float>(),
                           capture.layer_rows(0));
      moe::fused_experts_of_ids(gpu, x, ids.data<int32_t>(), weights.data<float>(), k, dev, grouping, activated,
                                   expert_out, out);
    });
    moe::MonolithicMoeStep step;
    step.hidden = &x;
    step.router = &router;
    step.rule = rule;
    step.capture = capture.layer_rows(0);
    step.ids = ids.data<int32_t>();
    step.weights = weights.data<float>();
    const double monolithic_ms =
        mean_ms(gpu, [&] { moe::monolithic_moe_on_device(gpu, step, dev, sync, scratch, out); });
    const Tensor host_ids = backend::to_host(gpu, ids);
    const std::set<int32_t> distinct(host_ids.data<int32_t>(), host_ids.data<int32_t>() + batch * k);
    const double bytes = static_cast<double>(distinct.size()) * expert_bytes + 4.0 * static_cast<double>(experts * h);
    const double floor_ms = bytes / kCopyBandwidth * 1e3;
    std::printf("{\"bench\":\"moe_layer_paths\",\"weights\":\"%s\",\"batch\":%lld,\"distinct_experts\":%zu,"
                "\"MB\":%.1f,\"modular_ms\":%.4f,\"mega_ms\":%.4f,\"monolithic_ms\":%.4f,\"floor_ms\":%.4f,"
                "\"mega_of_floor\":%.3f}\n",
                fp8 ? "fp8" : "bf16", static_cast<long long>(batch), distinct.size(), bytes / 1e6, modular_ms, mega_ms,
                monolithic_ms, floor_ms, floor_ms / mega_ms);
  }
}

void attention(backend::Context& gpu) {
  const int64_t heads = 32, kv_heads = 4, d = 128, context = 1024, block = 16, width = kv_heads * d;
  for (const DType pool_dtype : {DType::F32, DType::BF16})
  for (const int64_t batch : {1, 8, 64, 256}) {
    const int64_t blocks_per_seq = context / block, pool_blocks = batch * blocks_per_seq;
    Tensor keys = backend::to_device(gpu, random_host(pool_dtype, {pool_blocks * block, width}, 6, 1.0f));
    Tensor values = backend::to_device(gpu, random_host(pool_dtype, {pool_blocks * block, width}, 7, 1.0f));
    std::vector<int32_t> tables(static_cast<std::size_t>(pool_blocks)), seqs(static_cast<std::size_t>(batch)),
        positions(static_cast<std::size_t>(batch), static_cast<int32_t>(context - 1));
    for (int64_t i = 0; i < pool_blocks; ++i) tables[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    for (int64_t s = 0; s < batch; ++s) seqs[static_cast<std::size_t>(s)] = static_cast<int32_t>(s);
    const Tensor tables_d = backend::to_device(gpu, Tensor::from(tables, {pool_blocks}));
    const Tensor seqs_d = backend::to_device(gpu, Tensor::from(seqs, {batch}));
    const Tensor positions_d = backend::to_device(gpu, Tensor::from(positions, {batch}));
    const ops::StepView step{batch, nullptr, positions_d.data<int32_t>(), seqs_d.data<int32_t>(), tables_d.data<int32_t>(),
                               blocks_per_seq, context};
    const ops::KvPool pool{keys.raw_data(), values.raw_data(), width, width, block, pool_blocks,
                                 pool_dtype == DType::BF16};
    const Tensor q = backend::to_device(gpu, random_host(DType::F32, {batch, heads, d}, 8, 1.0f));
    Tensor out = backend::device_empty(gpu, DType::F32, {batch, heads, d});
    const double ms = mean_ms(gpu, [&] { ops::cuda::paged_attention(gpu, q, step, pool, kv_heads, 0.088f, 0, nullptr, out); });
    const double bytes = 2.0 * static_cast<double>(batch * context * width) * static_cast<double>(dtype_size(pool_dtype));
    const double floor_ms = bytes / kCopyBandwidth * 1e3;
    std::printf("{\"bench\":\"attention_decode\",\"kv\":\"%s\",\"batch\":%lld,\"context\":%lld,\"MB\":%.1f,\"ms\":%.4f,"
                "\"floor_ms\":%.4f,\"of_floor\":%.3f}\n",
                pool_dtype == DType::BF16 ? "bf16" : "f32", static_cast<long long>(batch), static_cast<long long>(context),
                bytes / 1e6, ms, floor_ms, floor_ms / ms);
  }
}

// The projections at Qwen3-30B-A3B's shapes, run as a bfloat16 model's step runs them (reduced
// precision: FP8 weights of 5 to 16 rows on the tensor-core rows kernel).
void linear(backend::Context& gpu) {
  const backend::ReducedPrecisionScope bf16_model(gpu, true);
  struct Shape2 { const char* name; int64_t n, k; DType dtype; };
  for (const Shape2 w : {Shape2{"qkv_proj", 5120, 2048, DType::BF16}, Shape2{"q_proj", 4096, 2048, DType::BF16},
                         Shape2{"k_proj", 512, 2048, DType::BF16},
                         Shape2{"o_proj", 2048, 4096, DType::BF16}, Shape2{"router", 128, 2048, DType::F32},
                         Shape2{"lm_head", 151936, 2048, DType::BF16}, Shape2{"qkv_proj_fp8", 5120, 2048, DType::F8_E4M3},
                         Shape2{"o_proj_fp8", 2048, 4096, DType::F8_E4M3}}) {
    Tensor weight;
    if (w.dtype == DType::F8_E4M3) {
      BlockScales scales;
      scales.scales = fp8_scales_host({w.n, w.k}, 1e-4f);
      scales.block_rows = scales.block_cols = 128;
      weight = backend::to_device(gpu, random_fp8_host({w.n, w.k}, 9).with_block_scales(std::move(scales)));
    } else {
      weight = backend::to_device(gpu, random_host(w.dtype, {w.n, w.k}, 9, 0.02f));
    }
    for (const int64_t batch : {1, 8, 64, 256}) {
      const Tensor x = backend::to_device(gpu, random_host(DType::F32, {batch, w.k}, 10, 1.0f));
      Tensor y = backend::device_empty(gpu, DType::F32, {batch, w.n});
      const double ms = mean_ms(gpu, [&] { ops::linear(gpu, x, weight, nullptr, y); });
      const double bytes = static_cast<double>(weight.nbytes()) + 4.0 * static_cast<double>(batch * (w.n + w.k));
      const double floor_ms = bytes / kCopyBandwidth * 1e3;
      std::printf("{\"bench\":\"linear\",\"weight\":\"%s\",\"batch\":%lld,\"MB\":%.1f,\"ms\":%.4f,\"floor_ms\":%.4f,"
                  "\"of_floor\":%.3f}\n",
                  w.name, static_cast<long long>(batch), bytes / 1e6, ms, floor_ms, floor_ms / ms);
    }
  }
}

void draws(backend::Context& gpu) {
  const int64_t vocab = 151936;
  ops::cuda::TokenDrawer spread, one_block(false);
  for (const int64_t rows : {1, 8, 16, 64}) {
    const Tensor logits = backend::to_device(gpu, random_host(DType::F32, {rows, vocab}, 11, 3.0f));
    std::vector<ops::TokenDraw> params(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < params.size(); ++r) {
      params[r].temperature = 1.0;
      params[r].logprobs = 0;
      params[r].uniform = static_cast<double>(r * 40503 % 65536) / 65536.0;
    }
    std::vector<ops::DrawnToken> drawn(params.size());
    const double spread_ms = mean_ms(gpu, [&] { spread.draw(gpu, logits, params, drawn); });
    const double one_block_ms = mean_ms(gpu, [&] { one_block.draw(gpu, logits, params, drawn); });
    std::printf("{\"bench\":\"draws\",\"rows\":%lld,\"vocab\":%lld,\"spread_ms\":%.4f,\"one_block_ms\":%.4f,"
                "\"spread_steps\":%lld}\n",
                static_cast<long long>(rows), static_cast<long long>(vocab), spread_ms, one_block_ms,
                static_cast<long long>(spread.spread_steps()));
  }
}

// The time per kernel of a graph of trivial kernels, with and without programmatic launch.
void graph_kernel_gap(backend::Context& gpu) {
  for (const unsigned blocks : {1u, 132u, 1056u}) {
    std::printf("{\"bench\":\"graph_kernel_gap\",\"blocks\":%u,\"programmatic_us\":%.3f,\"plain_us\":%.3f}\n",
                blocks, bench::graph_kernel_gap_us(gpu, blocks, true), bench::graph_kernel_gap_us(gpu, blocks, false));
  }
}

// A 48-layer chain of a decode layer's stages without r3's arithmetic, run six ways, with the
// projections' weights as bfloat16 and as FP8; the persistent ways with as many blocks an SM as
// fit (their first run) and with 1, 2 and 4.
void stage_chains(backend::Context& gpu) {
  using bench::StageChainRun;
  using bench::StageChainWeights;
  for (const auto& [weights, weights_name] :
       {std::pair{StageChainWeights::kBf16, "bf16"}, std::pair{StageChainWeights::kFp8, "fp8"}}) {
    for (const auto& [run, name] : {std::pair{StageChainRun::kKernels, "kernels"},
                                    std::pair{StageChainRun::kKernelsEarly, "kernels_early"},
                                    std::pair{StageChainRun::kPersistent, "persistent"},
                                    std::pair{StageChainRun::kPersistentAhead, "persistent_ahead"},
                                    std::pair{StageChainRun::kKernelsFolded, "kernels_folded"},
                                    std::pair{StageChainRun::kPersistentFolded, "persistent_folded"}}) {
      const bool persistent = run == StageChainRun::kPersistent || run == StageChainRun::kPersistentAhead ||
                              run == StageChainRun::kPersistentFolded;
      for (const int per_sm : {0, 1, 2, 4}) {
        if (per_sm > 0 && !persistent) break;
        const bench::StageChainTiming t = bench::time_stage_chain(gpu, run, weights, 48, per_sm);
        std::printf("{\"bench\":\"stage_chain\",\"weights\":\"%s\",\"run\":\"%s\",\"blocks\":%d,"
                    "\"MB_per_layer\":%.1f,\"ms_per_layer\":%.4f,\"TB_per_s\":%.3f}\n",
                    weights_name, name, t.blocks, bench::stage_chain_bytes_per_layer(weights) / 1e6, t.ms_per_layer,
                    t.tb_per_s);
      }
    }
  }
}

}  // namespace
}  // namespace r3

// Usage: r3_gpu_kernels_bench [--kernel-choice NAME=VALUE ...] [section ...] (moe_layer, attention,
// linear, draws, graph_kernel_gap, in_graph, projection_in_graph, stage_chain); no section: every
// section. --kernel-choice as for r3 (backend/cuda/kernel_choices.h).
int main(int argc, char** argv) {
  std::set<std::string> sections;
  std::vector<std::string> choices;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--kernel-choice" && i + 1 < argc) choices.emplace_back(argv[++i]);
    else sections.insert(argv[i]);
  }
  auto wanted = [&](const char* name) { return sections.empty() || sections.count(name) > 0; };
  try {
    r3::backend::cuda::KernelChoices kernel_choices;
    for (const std::string& choice : choices) kernel_choices.set(choice);
    auto gpu = r3::backend::Context::cuda(0);
    gpu->set_kernel_choices(kernel_choices);
    if (wanted("moe_layer")) {
      r3::moe_layer(*gpu, false);
      r3::moe_layer(*gpu, true);
    }
    if (wanted("attention")) r3::attention(*gpu);
    if (wanted("linear")) r3::linear(*gpu);
    if (wanted("draws")) r3::draws(*gpu);
    if (wanted("graph_kernel_gap")) r3::graph_kernel_gap(*gpu);
    if (wanted("in_graph")) r3::bench::small_ops_in_graph(*gpu);
    if (wanted("projection_in_graph")) r3::bench::projections_in_graph(*gpu);
    if (wanted("stage_chain")) r3::stage_chains(*gpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "r3_gpu_kernels_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
