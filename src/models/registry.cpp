#include "models/registry.h"

#include <algorithm>
#include <optional>

#include <spdlog/spdlog.h>

#include "core/progress.h"
#include "io/checkpoint.h"
#include "models/decoder_builder.h"
#include "models/families/families.h"

namespace r3::models {

namespace {

const Family& family_of(const HfConfig& config) {
  const std::string arch = config.architecture();
  const std::string type = config.model_type();
  const Family* match = nullptr;
  for (const Family& f : all_families()) {
    if (std::find(f.architectures.begin(), f.architectures.end(), arch) != f.architectures.end()) {
      match = &f;
    }
  }
  for (const Family& f : all_families()) {
    if (match == nullptr && !type.empty() && f.model_type == type) match = &f;
  }
  if (match == nullptr) {
    std::string supported;
    for (const Family& f : all_families()) {
      supported += (supported.empty() ? "" : ", ") + f.architectures.front() + " (" + f.model_type + ")";
    }
    R3_FAIL(config.source(), ": unsupported architecture '", arch.empty() ? "?" : arch,
            "' (model_type '", type.empty() ? "?" : type, "'); supported: ", supported);
  }
  return *match;
}

}  // namespace

DecoderSpec spec_from_config(const HfConfig& config) {
  const Family& family = family_of(config);
  R3_CHECK(family.parse != nullptr, config.source(), ": ", family.model_type, " is not a Llama-style decoder");
  DecoderSpec spec = family.parse(config);
  spec.validate();
  return spec;
}

std::unique_ptr<CausalLM> load_model(const std::string& model_dir, const LoadOptions& options) {
  const HfConfig config = HfConfig::load(model_dir);
  const Family& family = family_of(config);
  std::optional<DecoderSpec> spec;
  if (family.parse != nullptr) spec = spec_from_config(config);  // config errors before any weight loads
  WeightQuantization quantization = WeightQuantization::from_config(config);
  R3_CHECK(!quantization.mxfp4() || (spec && spec->moe.expert_layout == ExpertLayout::kGptOssFused), config.source(),
           ": quantization_config.quant_method 'mxfp4' stores GPT-OSS's fused experts (gate_up_proj_blocks, "
           "down_proj_blocks); ", family.model_type, " has no such experts");
  Checkpoint checkpoint = Checkpoint::open(model_dir);
  checkpoint.set_quantization(std::move(quantization));
  Progress progress("loading " + model_dir, checkpoint.total_bytes());
  checkpoint.on_load([&](uint64_t bytes) { progress.advance(bytes); });
  auto table = std::make_shared<ParameterTable>();
  ParameterLoader params(checkpoint, *table);
  std::unique_ptr<CausalLM> model =
      spec ? std::unique_ptr<CausalLM>(build_decoder(*spec, params, options)) : family.load(config, params, options);
  const auto unused = checkpoint.unused();
  if (!unused.empty()) {
    spdlog::warn("{} checkpoint tensors were not used by the {} model, e.g. '{}'", unused.size(),
                 family.model_type, unused.front());
  }
  model->set_parameters(std::move(table));
  return model;
}

}  // namespace r3::models
