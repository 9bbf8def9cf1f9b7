// One entry per supported model family: how to recognise its config.json and how to turn it into
// a DecoderSpec. Each family lives in its own file beside this one.
#pragma once

#include <string>
#include <vector>

#include "io/hf_config.h"
#include "models/decoder_spec.h"

namespace r3::models {

struct Family {
  std::string model_type;                  // config.json "model_type"
  std::vector<std::string> architectures;  // config.json "architectures"
  DecoderSpec (*parse)(const HfConfig& config);
};

DecoderSpec parse_qwen3_moe(const HfConfig& config);
DecoderSpec parse_qwen2_moe(const HfConfig& config);
DecoderSpec parse_mixtral(const HfConfig& config);
DecoderSpec parse_olmoe(const HfConfig& config);

// Every family r3 supports, in one list (no static registration that a linker could drop).
const std::vector<Family>& all_families();

}  // namespace r3::models
