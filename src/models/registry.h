// Loading a model folder: config.json picks the family (by `architectures`, then `model_type`),
// the family builds a DecoderSpec, the builder loads the weights.
#pragma once

#include <memory>
#include <string>

#include "io/hf_config.h"
#include "models/causal_lm.h"
#include "models/decoder_spec.h"
#include "models/load_options.h"

namespace r3::models {

// The Llama-style decoder spec of a config. Throws r3::Error for an unknown architecture
// (listing the supported ones) or one that is not described by a DecoderSpec.
DecoderSpec spec_from_config(const HfConfig& config);

// Loads config + weights; shows progress on stderr when loading takes more than a moment.
std::unique_ptr<CausalLM> load_model(const std::string& model_dir, const LoadOptions& options = {});

}  // namespace r3::models
