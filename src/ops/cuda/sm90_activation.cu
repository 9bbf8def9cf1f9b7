// Gated activations on the GPU, element by element as the CPU's: SwiGLU with GPT-OSS's clamp (out =
// silu(min(gate, limit)) * clamp(up, -limit, limit)), Kimi K3's SiTU, and the sigmoid gate of its
// latent attention.
#include <algorithm>

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

// ops::situ in float32, with CUDA's tanhf and expf.
__global__ void situ_and_mul_elements(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                                      float beta, float linear_beta, float* out) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float u = isinf(linear_beta) ? up[i] : linear_beta * tanhf(up[i] / linear_beta);
    out[i] = beta * tanhf(g / beta) * (1.0f / (1.0f + expf(-g))) * u;
  }
}

__global__ void mul_sigmoid_elements(const float* __restrict__ gate, int64_t n, float* __restrict__ x) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= 1.0f / (1.0f + expf(-gate[i]));
  }
}

unsigned element_blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

}  // namespace

void situ_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float beta,
                  float linear_beta) {
  R3_CHECK(gate.shape() == up.shape() && gate.shape() == out.shape() && gate.device() == Device::kCuda &&
               up.device() == Device::kCuda && out.device() == Device::kCuda,
           "situ_and_mul (cuda): gate ", shape_to_string(gate.shape()), " up ", shape_to_string(up.shape()), " out ",
           shape_to_string(out.shape()));
  const int64_t n = out.numel();
  if (n == 0) return;
  backend::cuda::launch_kernel(situ_and_mul_elements, element_blocks(n), 256, 0, ctx.cuda_state().stream,
                               gate.data<float>(), up.data<float>(), n, beta, linear_beta, out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

void mul_sigmoid(backend::Context& ctx, const Tensor& gate, Tensor& x) {
  R3_CHECK(gate.shape() == x.shape() && gate.device() == Device::kCuda && x.device() == Device::kCuda,
           "mul_sigmoid (cuda): gate ", shape_to_string(gate.shape()), " x ", shape_to_string(x.shape()));
  const int64_t n = x.numel();
  if (n == 0) return;
  backend::cuda::launch_kernel(mul_sigmoid_elements, element_blocks(n), 256, 0, ctx.cuda_state().stream,
                               gate.data<float>(), n, x.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

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
