// One entry per supported model family: how to recognise its config.json and how to turn it into
// a DecoderSpec. Each family lives in its own file beside this one.
#pragma once

#include <string>
#include <vector>

#include "io/hf_config.h"
#include "models/causal_lm.h"
#include "models/decoder_spec.h"
#include "models/load_options.h"
#include "models/parameter_table.h"

namespace r3::models {

// A family is either a Llama-style decoder described by a DecoderSpec (`parse`), or a model
// with its own structure that loads itself (`load`).
struct Family {
  std::string model_type;                  // config.json "model_type"
  std::vector<std::string> architectures;  // config.json "architectures"
  DecoderSpec (*parse)(const HfConfig& config) = nullptr;
  std::unique_ptr<CausalLM> (*load)(const HfConfig& config, ParameterLoader& params,
                                    const LoadOptions& options) = nullptr;
};

DecoderSpec parse_qwen3_moe(const HfConfig& config);
DecoderSpec parse_qwen2_moe(const HfConfig& config);
DecoderSpec parse_mixtral(const HfConfig& config);
DecoderSpec parse_olmoe(const HfConfig& config);
DecoderSpec parse_glm4_moe(const HfConfig& config);
DecoderSpec parse_deepseek_v2(const HfConfig& config);
DecoderSpec parse_deepseek_v3(const HfConfig& config);
DecoderSpec parse_gpt_oss(const HfConfig& config);
DecoderSpec parse_kimi_linear(const HfConfig& config);
std::unique_ptr<CausalLM> load_kimi_k3(const HfConfig& config, ParameterLoader& params,
                                       const LoadOptions& options);
std::unique_ptr<CausalLM> load_deepseek_v4(const HfConfig& config, ParameterLoader& params,
                                           const LoadOptions& options);

// Every family r3 supports, in one list (no static registration that a linker could drop).
const std::vector<Family>& all_families();

}  // namespace r3::models
