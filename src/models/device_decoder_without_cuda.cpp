// The device entry points of models/device_decoder.h in a build without the CUDA backend: each
// refuses by name (models/cuda/device_decoder.cpp has the real ones).
#include "models/device_decoder.h"

#if !R3_WITH_CUDA
namespace r3::models {

int64_t graph_replays(const CausalLM& model) {
  (void)model;
  return 0;
}

StepGraphNodes step_graph_nodes(const CausalLM& model) {
  (void)model;
  return {};
}

void set_capture_routing(CausalLM& model, bool on) {
  (void)model;
  (void)on;
  R3_FAIL("capture on/off: not a device model (this build of r3 has no CUDA backend)");
}

std::unique_ptr<CausalLM> synthetic_on_device(backend::Context& ctx, const SyntheticShape& shape, uint64_t seed,
                                              bool capture_routing) {
  (void)ctx;
  (void)shape;
  (void)seed;
  (void)capture_routing;
  R3_FAIL("--synthetic: this build of r3 has no CUDA backend");
}

void set_moe_path(CausalLM& model, moe::MoePath path) {
  (void)model;
  (void)path;
  R3_FAIL("--moe-path: this build of r3 has no CUDA backend");
}

std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model, DType weights,
                                          moe::MoePath moe_path, moe::ExpertSlice experts) {
  (void)experts;
  (void)ctx;
  (void)model;
  (void)weights;
  (void)moe_path;
  R3_FAIL("--device cuda: this build of r3 has no CUDA backend (nvcc was not found when it was built)");
}

}  // namespace r3::models
#endif
