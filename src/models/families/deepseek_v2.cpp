// DeepSeek-V2 (DeepseekV2ForCausalLM): multi-head latent attention (q LoRA optional), softmax
// routing, greedy or group-limited greedy, shared experts, dense first layers.
#include "models/families/common_config.h"
#include "models/families/families.h"

#include "core/check.h"

namespace r3::models {

DecoderSpec parse_deepseek_v2(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "deepseek_v2";
  read_deepseek_common(config, spec);
  spec.moe.router = RouterKind::kSoftmaxGroupGreedy;
  const std::string method = config.get_string("topk_method", "greedy");
  if (method == "greedy") {
    spec.moe.topk_groups = spec.moe.num_groups;  // every group eligible
  } else {
    R3_CHECK(method == "group_limited_greedy", config.source(), ": topk_method '", method,
             "' is not supported (greedy, group_limited_greedy)");
  }
  return spec;
}

}  // namespace r3::models
