// place_on_device in a build without the CUDA backend (models/cuda/device_decoder.cpp has the real one).
#include "models/device_decoder.h"

#if !R3_WITH_CUDA
namespace r3::models {

std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model, DType weights) {
  (void)ctx;
  (void)model;
  (void)weights;
  R3_FAIL("--device cuda: this build of r3 has no CUDA backend (nvcc was not found when it was built)");
}

}  // namespace r3::models
#endif
