#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/fill_random.h"

namespace r3::ops::cuda {

namespace {

// splitmix64's finaliser: a well-mixed 64-bit value per (seed, index).
__device__ inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void fill(T* __restrict__ out, int64_t n, uint64_t seed, float center, float bound) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;  // 24 bits: [-1, 1)
    const float v = center + bound * u;
    if constexpr (sizeof(T) == 4) out[i] = v;
    else if constexpr (sizeof(T) == 2) out[i] = __float2bfloat16_rn(v);
    else out[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void fill_uniform(backend::Context& ctx, Tensor& t, uint64_t seed, float center, float bound) {
  R3_CHECK(t.device() == Device::kCuda && t.is_contiguous() &&
               (t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F8_E4M3),
           "fill_uniform (cuda): a contiguous F32, BF16 or F8_E4M3 device tensor expected");
  if (t.numel() == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((t.numel() + 255) / 256, 65536));
  const cudaStream_t stream = ctx.cuda_state().stream;
  if (t.dtype() == DType::F32) {
    backend::cuda::launch_kernel(fill<float>, blocks, 256, 0, stream, t.data<float>(), t.numel(), seed, center, bound);
  } else if (t.dtype() == DType::F8_E4M3) {
    backend::cuda::launch_kernel(fill<__nv_fp8_storage_t>, blocks, 256, 0, stream,
                                 static_cast<__nv_fp8_storage_t*>(t.raw_data()), t.numel(), seed, center, bound);
  } else {
    backend::cuda::launch_kernel(fill<__nv_bfloat16>, blocks, 256, 0, stream, static_cast<__nv_bfloat16*>(t.raw_data()),
                                 t.numel(), seed, center, bound);
  }
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
