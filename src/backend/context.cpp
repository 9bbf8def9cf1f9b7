#include "backend/context.h"

#include "core/check.h"

namespace r3::backend {

Context::~Context() = default;

#if !R3_WITH_CUDA
std::unique_ptr<Context> Context::cuda(int index) {
  R3_FAIL("--device cuda (device ", index, "): this build has no CUDA backend (nvcc was not found when it was configured)");
}
bool Context::cuda_available() { return false; }
int Context::cuda_device_count() { return 0; }
cuda::State& Context::cuda_state() const { R3_FAIL("not a CUDA context"); }
void Context::set_kernel_choice(std::string_view, std::string_view) { R3_FAIL("kernel choices apply to a CUDA context"); }
void Context::set_kernel_choices(const cuda::KernelChoices&) { R3_FAIL("kernel choices apply to a CUDA context"); }
#endif

}  // namespace r3::backend
