#include "cli/model_options.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "backend/cuda/kernel_choices.h"
#include "cli/option_checks.h"
#include "io/process_memory.h"
#include "models/device_decoder.h"
#include "models/registry.h"
#include "moe/ep/expert_parallel_dispatcher.h"

namespace r3::cli {

void ModelOptions::add_to(CLI::App& command, bool model_required) {
  command.add_option("--model", model_dir, "Hugging Face model folder (config.json + *.safetensors)")
      ->required(model_required);
  command.add_option("--device", device,
                     "Where the model runs: cpu, or cuda (the first GPU; float32 weights, the parity mode)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  dtype_option = command.add_option("--dtype", dtype,
                     "Weights on the GPU: bfloat16, or float32 (the parity mode); activations are float32 in "
                     "both. Weights a checkpoint publishes quantized (FP8, MXFP4) stay so on either. The CPU "
                     "runs the checkpoint's own dtypes")
      ->capture_default_str()
      ->check(CLI::IsMember({"bfloat16", "float32"}));
  command.add_flag("--batch-invariant", batch_invariant,
                   "GPU: kernels whose results for a request do not depend on the rest of the batch (its routing "
                   "is the same alone or batched), at some speed; the CPU always is");
  command.add_option("--threads", threads, "CPU threads (default: all cores)")->check(at_least(0));
  command.add_option("--kernel-choice", kernel_choices,
                     "GPU, for experiments (repeatable): force a kernel choice the engine makes by shape, NAME=VALUE "
                     "with VALUE rule (the default), always or never; NAME one of " +
                         backend::cuda::KernelChoices::names() + " (backend/cuda/kernel_choices.h)")
      ->type_name("NAME=VALUE");
  // --moe-backend is an alias kept so existing scripts run; the option's own name avoids
  // "backend", which means the device backend.
  moe_path_option = command.add_option("--moe-path,--moe-backend", moe_path,
                     "MoE execution path: modular (router + grouped GEMMs), monolithic (one fused "
                     "routine), mega (fused experts module fed by the model's gate); "
                     "monolithic-nocapture is a fused kernel that cannot report its routing. "
                     "The CPU's default is monolithic; the GPU's is mega (routing, then fused experts), and it also "
                     "runs modular and monolithic (one kernel a MoE layer for decode steps of up to 4 tokens)")
      ->check(CLI::IsMember(moe::moe_path_names()));
  auto& eplb = load_options.eplb;
  command.add_option("--eplb-redundant-experts", eplb.redundant_experts,
                     "Extra physical expert replicas per MoE layer (EPLB)")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  command.add_option("--eplb-window", eplb.window_steps, "Steps of expert load EPLB balances over")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--eplb-rebalance-every", eplb.rebalance_every,
                     "Re-place experts every N steps from the measured load (0: never)")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  command.add_option("--eplb-layers-per-step", eplb.layers_per_step,
                     "MoE layers whose experts move after each step of a rebalance (0: all at once)")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  command.add_option("--eplb-groups", eplb.topology.num_groups, "Expert groups kept on one node")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--eplb-nodes", eplb.topology.num_nodes, "Nodes the experts are spread over")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--eplb-gpus", eplb.topology.num_gpus, "GPUs the experts are spread over")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
}

std::unique_ptr<models::CausalLM> ModelOptions::load(backend::Context& ctx, int rank, int ranks) const {
  const auto start = std::chrono::steady_clock::now();
  models::LoadOptions options = load_options;
  options.moe_path = moe::parse_moe_path(moe_path);
  auto model = models::load_model(model_dir, options);
  const auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  const auto& info = model->info();
  const std::string path = ctx.device() == Device::kCpu ? moe_path : gpu_moe_path();
  spdlog::info("loaded {} ({}, {} layers, {} MoE layers, {} experts, top-{}, MoE path {}) in {:.1f} ms",
               model_dir, info.family, info.num_layers, info.moe_layers.size(), info.num_experts,
               info.top_k, path, ms_since(start));
  if (ctx.device() == Device::kCpu) return model;
  const auto placed = std::chrono::steady_clock::now();
  moe::ExpertSlice experts;
  const std::vector<moe::MoeBlock*> blocks = model->moe_blocks();
  if (ranks > 1 && !blocks.empty()) {
    experts = moe::ep::contiguous_slice(blocks.front()->experts().num_physical(), ranks, rank);
    spdlog::info("expert-parallel rank {} of {} holds physical experts {} to {} of each MoE layer", rank, ranks,
                 experts.first, experts.first + experts.count - 1);
  }
  model = models::place_on_device(ctx, std::move(model), dtype == "float32" ? DType::F32 : DType::BF16,
                                  moe::parse_moe_path(path), experts);
  // The checkpoint's pages are released once the weights are on the device: what stays resident
  // is the process's own (caches, staging buffers), not a second copy of the weights.
  const ProcessMemory memory = process_memory();
  spdlog::info("weights copied to the {} device as {} (quantized ones as published) in {:.1f} ms; host memory "
               "resident now {:.2f} GiB (peak {:.2f} GiB)",
               device_name(ctx.device()), dtype, ms_since(placed), static_cast<double>(memory.resident_bytes) / (1 << 30),
               static_cast<double>(memory.peak_resident_bytes) / (1 << 30));
  return model;
}

std::string ModelOptions::gpu_moe_path() const {
  return moe_path_option != nullptr && moe_path_option->count() > 0 ? moe_path : "mega";
}

std::unique_ptr<backend::Context> ModelOptions::make_context() const {
  R3_CHECK(device == "cuda" || dtype_option == nullptr || dtype_option->count() == 0,
           "--dtype applies to --device cuda; the CPU runs the checkpoint's own dtypes");
  R3_CHECK(device == "cpu" || gpu_moe_path() != "monolithic-nocapture",
           "--moe-path monolithic-nocapture: the GPU runs mega, modular or monolithic (every GPU path captures)");
  R3_CHECK(device == "cuda" || kernel_choices.empty(), "--kernel-choice applies to --device cuda");
  if (device == "cuda") return make_cuda_context(0);
  return std::make_unique<backend::Context>(threads);
}

std::unique_ptr<backend::Context> ModelOptions::make_cuda_context(int index) const {
  backend::cuda::KernelChoices choices;
  for (const std::string& setting : kernel_choices) choices.set(setting);
  auto ctx = backend::Context::cuda(index);
  ctx->set_batch_invariant(batch_invariant);
  ctx->set_kernel_choices(choices);
  return ctx;
}

engine::PlaceRank ModelOptions::rank_placer(int ranks) const {
  if (device != "cuda") return {};
  return [this, ranks](int rank) {
    const int devices = backend::Context::cuda_device_count();
    R3_CHECK(devices > 0, "--ep on --device cuda: no CUDA device");
    if (rank >= devices) spdlog::warn("--ep: rank {} shares GPU {} ({} found)", rank, rank % devices, devices);
    engine::PlacedRank placed;
    placed.ctx = make_cuda_context(rank % devices);
    placed.model = load(*placed.ctx, rank, ranks);
    return placed;
  };
}

}  // namespace r3::cli
