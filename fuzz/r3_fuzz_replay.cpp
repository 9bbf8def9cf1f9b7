// libFuzzer target: a --replay file, read both as JSON and as safetensors, for a model shaped like
// the qwen3_moe fixture (3 MoE layers, top-2 of 8 experts), whose `generate --json` output and
// reference_0.safetensors are the seeds. Every accepted id must be a valid expert.
#include <cstdint>
#include <cstdlib>

#include "core/check.h"
#include "engine/routing_replay.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int64_t layers = 3, top_k = 2, experts = 8;
  for (const char* suffix : {".json", ".safetensors"}) {
    const std::string& path = r3::fuzz::write_input(data, size, suffix);
    try {
      const r3::engine::RoutingReplay replay = r3::engine::load_routing_replay(path, layers, top_k, experts);
      if (static_cast<int64_t>(replay.ids.size()) != replay.rows * replay.layers * replay.top_k) std::abort();
      for (int32_t id : replay.ids) {
        if (id < 0 || id >= experts) std::abort();  // accepted an id outside the model's experts
      }
    } catch (const r3::Error&) {
    }
  }
  return 0;
}
