// SwiGLU on the GPU, with GPT-OSS's clamp: out = silu(min(gate, limit)) * clamp(up, -limit, limit),
// the CPU's clamped_swiglu element by element.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/activation.h"

namespace r3::ops::cuda {

namespace {

__global__ void silu_and_mul_elements(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                                      float limit, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i] > limit ? limit : gate[i];
    const float u = up[i] > limit ? limit : (up[i] < -limit ? -limit : up[i]);
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

}  // namespace

void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float limit) {
  R3_CHECK(gate.shape() == up.shape() && gate.shape() == out.shape() && gate.device() == Device::kCuda &&
               up.device() == Device::kCuda && out.device() == Device::kCuda,
           "silu_and_mul (cuda): gate ", shape_to_string(gate.shape()), " up ", shape_to_string(up.shape()), " out ",
           shape_to_string(out.shape()));
  const int64_t n = out.numel();
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
  backend::cuda::launch_kernel(silu_and_mul_elements, static_cast<unsigned>(blocks), 256, 0, ctx.cuda_state().stream,
                               gate.data<float>(), up.data<float>(), n, limit, out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
