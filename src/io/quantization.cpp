#include "io/quantization.h"

#include "core/check.h"
#include "io/hf_config.h"
#include "io/input_file.h"

namespace r3 {

namespace {

// Whether `text` matches `pattern`, where `*` matches any run of characters (dots included).
bool glob_match(const std::string& pattern, const std::string& text) {
  std::size_t p = 0, t = 0, star = std::string::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string::npos) {  // let the last star take one more character
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

WeightQuantization WeightQuantization::from_config(const HfConfig& config) {
  WeightQuantization q;
  q.source = config.source();
  const std::optional<HfConfig> c = config.get_object("quantization_config");
  if (!c) return q;
  const std::string where = config.source() + ": quantization_config";
  const std::string method = c->get_string("quant_method", "");
  R3_CHECK(method == "fp8" || method == "mxfp4", where, ".quant_method '", brief(method),
           "' is not supported (r3 runs block-scaled \"fp8\" and GPT-OSS's \"mxfp4\" checkpoints)");
  q.modules_to_not_convert = c->get_string_list("modules_to_not_convert", {});
  if (method == "mxfp4") {
    // The published configs hold nothing else; transformers' own `dequantize` flag only says
    // what its loader does with the same stored blocks.
    q.method = QuantMethod::kMxfp4;
    return q;
  }
  const std::string fmt = c->get_string("fmt", "e4m3");
  R3_CHECK(fmt == "e4m3", where, ".fmt '", brief(fmt), "' is not supported (r3 runs \"e4m3\")");
  const std::string activations = c->get_string("activation_scheme", "dynamic");
  R3_CHECK(activations == "dynamic", where, ".activation_scheme '", brief(activations),
           "' is not supported (r3 runs \"dynamic\": weights dequantized, activations in float32)");
  R3_CHECK(c->has("weight_block_size"), where,
           ".weight_block_size is missing (r3 runs block-scaled FP8: [rows, cols] of one scale's block)");
  const std::vector<int64_t> block = c->get_int_list<int64_t>("weight_block_size", {});
  R3_CHECK(block.size() == 2 && block[0] >= 1 && block[1] >= 1 && block[0] <= (1 << 20) && block[1] <= (1 << 20),
           where, ".weight_block_size must be two block sizes in [1, 1048576], e.g. [128, 128]");
  const std::string scale_fmt = c->get_string("scale_fmt", "float");
  R3_CHECK(scale_fmt == "float" || scale_fmt == "ue8m0", where, ".scale_fmt '", brief(scale_fmt),
           "' is not supported (r3 runs \"float\" and DeepSeek-V4's \"ue8m0\" power-of-two scales)");
  q.power_of_two_scales = scale_fmt == "ue8m0";
  q.method = QuantMethod::kFp8;
  q.block_rows = block[0];
  q.block_cols = block[1];
  return q;
}

std::string WeightQuantization::excluded_by(const std::string& name) const {
  const std::size_t dot = name.rfind('.');
  const std::string module = dot == std::string::npos ? name : name.substr(0, dot);
  for (const std::string& entry : modules_to_not_convert) {
    if (entry.empty()) continue;
    // The module itself or one of the modules holding it: every prefix ending at a name boundary.
    for (std::size_t end = 0; end != std::string::npos;) {
      end = module.find('.', end + 1);
      if (glob_match(entry, module.substr(0, end))) return entry;
    }
  }
  return "";
}

}  // namespace r3
