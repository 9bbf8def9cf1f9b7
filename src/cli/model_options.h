// Options every model command shares (--model, --device, --threads, the MoE path, EPLB) and
// loading the model with a timing line on stderr.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/context.h"
#include "engine/engine.h"
#include "models/causal_lm.h"
#include "models/load_options.h"

namespace r3::cli {

struct ModelOptions {
  std::string model_dir;
  std::string device = "cpu";
  std::string dtype = "bfloat16";  // of the weights on the GPU
  bool batch_invariant = false;
  int threads = 0;
  std::string moe_path = "monolithic";  // the CPU default (docs/performance.md); the GPU's is gpu_moe_path()
  std::vector<std::string> kernel_choices;  // --kernel-choice NAME=VALUE (backend/cuda/kernel_choices.h)
  models::LoadOptions load_options;
  CLI::Option* dtype_option = nullptr;
  CLI::Option* moe_path_option = nullptr;

  // model_required = false: the command checks for --model itself (r3 bench --synthetic needs none).
  void add_to(CLI::App& command, bool model_required = true);
  // The MoE path a GPU placement runs: --moe-path when given, else mega.
  std::string gpu_moe_path() const;
  // The model, placed on ctx's device; logs load time and model summary. As rank `rank` of
  // `ranks` expert-parallel GPU ranks, each MoE layer holds only the rank's slice of its physical
  // experts on the device.
  std::unique_ptr<models::CausalLM> load(backend::Context& ctx, int rank = 0, int ranks = 1) const;
  // The execution context the commands run on: the CPU (its thread pool has `threads` threads)
  // or CUDA device 0.
  std::unique_ptr<backend::Context> make_context() const;
  // A context on CUDA device `index` with the options that apply to one: --batch-invariant and
  // --kernel-choice (checked before the device is opened).
  std::unique_ptr<backend::Context> make_cuda_context(int index) const;
  // With --device cuda, how the engine places expert-parallel rank r of `ranks` (--ep): a context
  // on device r modulo the devices present (ranks share a device only where there are fewer) and
  // the model loaded and placed there with the rank's slice of the experts (load). Empty on the
  // CPU, whose ranks share the one model.
  engine::PlaceRank rank_placer(int ranks) const;
};

}  // namespace r3::cli
