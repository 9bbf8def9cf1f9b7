// libFuzzer target: config.json text -> HfConfig -> the model spec of every family (the decoder
// families' DecoderSpec and DeepSeek-V4's spec), which is where every size r3 allocates from
// comes from. Each must be refused with an r3::Error or give a spec whose validation passes.
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/hf_config.h"
#include "models/deepseek_v4/v4_spec.h"
#include "models/families/families.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  r3::HfConfig config;
  try {
    config = r3::HfConfig::parse(text, "config.json");
  } catch (const r3::Error&) {
    return 0;
  }
  for (const r3::models::Family& family : r3::models::all_families()) {
    if (family.parse == nullptr) continue;
    try {
      family.parse(config).validate();
    } catch (const r3::Error&) {
    }
  }
  try {
    r3::models::DeepseekV4Spec::parse(config);
  } catch (const r3::Error&) {
  }
  return 0;
}
