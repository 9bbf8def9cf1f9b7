// libFuzzer target: an `r3 eplb-plan` load file. Accepted loads must be non-negative numbers with
// the same expert count in every layer.
#include <cstdint>
#include <cstdlib>

#include "core/check.h"
#include "fuzz_input.h"
#include "io/expert_load_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = r3::fuzz::write_input(data, size, ".json");
  try {
    const auto layers = r3::read_expert_loads(path);
    for (const auto& layer : layers) {
      if (layer.size() != layers[0].size()) std::abort();
      for (double v : layer) {
        if (!(v >= 0)) std::abort();
      }
    }
  } catch (const r3::Error&) {
  }
  return 0;
}
