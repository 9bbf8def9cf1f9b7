#include "models/registry.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "core/progress.h"
#include "io/checkpoint.h"
#include "models/decoder_builder.h"
#include "models/families/families.h"

namespace r3::models {

DecoderSpec spec_from_config(const HfConfig& config) {
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
  DecoderSpec spec = match->parse(config);
  spec.validate();
  return spec;
}

std::unique_ptr<CausalLM> load_model(const std::string& model_dir, const LoadOptions& options) {
  const HfConfig config = HfConfig::load(model_dir);
  const DecoderSpec spec = spec_from_config(config);
  Checkpoint checkpoint = Checkpoint::open(model_dir);
  Progress progress("loading " + model_dir, checkpoint.total_bytes());
  checkpoint.on_load([&](uint64_t bytes) { progress.advance(bytes); });
  auto model = build_decoder(spec, checkpoint, options);
  const auto unused = checkpoint.unused();
  if (!unused.empty()) {
    spdlog::warn("{} checkpoint tensors were not used by the {} model, e.g. '{}'", unused.size(),
                 spec.family, unused.front());
  }
  return model;
}

}  // namespace r3::models
