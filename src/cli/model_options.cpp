#include "cli/model_options.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "models/registry.h"

namespace r3::cli {

void ModelOptions::add_to(CLI::App& command) {
  command.add_option("--model", model_dir, "Hugging Face model folder (config.json + *.safetensors)")
      ->required();
  command.add_option("--threads", threads, "CPU threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
}

std::unique_ptr<models::DecoderModel> ModelOptions::load() const {
  const auto start = std::chrono::steady_clock::now();
  auto model = models::load_model(model_dir);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const auto& info = model->info();
  spdlog::info("loaded {} ({}, {} layers, {} MoE layers, {} experts, top-{}) in {:.1f} ms",
               model_dir, info.family, info.num_layers, info.moe_layers.size(), info.num_experts,
               info.top_k, ms);
  return model;
}

std::unique_ptr<ThreadPool> ModelOptions::make_pool() const {
  return std::make_unique<ThreadPool>(threads);
}

}  // namespace r3::cli
