#include "models/families/families.h"

namespace r3::models {

const std::vector<Family>& all_families() {
  static const std::vector<Family> families = {
      {"qwen3_moe", {"Qwen3MoeForCausalLM"}, &parse_qwen3_moe},
      {"qwen2_moe", {"Qwen2MoeForCausalLM"}, &parse_qwen2_moe},
      {"mixtral", {"MixtralForCausalLM"}, &parse_mixtral},
      {"olmoe", {"OlmoeForCausalLM"}, &parse_olmoe},
      {"glm4_moe", {"Glm4MoeForCausalLM"}, &parse_glm4_moe},
      {"deepseek_v2", {"DeepseekV2ForCausalLM"}, &parse_deepseek_v2},
      {"deepseek_v3", {"DeepseekV3ForCausalLM"}, &parse_deepseek_v3},
      {"gpt_oss", {"GptOssForCausalLM"}, &parse_gpt_oss},
      {"kimi_linear", {"KimiLinearForCausalLM"}, &parse_kimi_linear},
      {"deepseek_v4", {"DeepseekV4ForCausalLM"}, nullptr, &load_deepseek_v4},
      {"kimi_k3", {"KimiK3ForCausalLM"}, nullptr, &load_kimi_k3},
  };
  return families;
}

}  // namespace r3::models
