// Pieces shared by the two fused experts paths (sm90_fused_experts.cu: weight-streaming rows;
// sm90_experts_tensor_cores.cu: bfloat16 tensor cores): the experts' activations, the step's
// (token, choice) pairs grouped by expert, and the tensor-core path's entry. Internal to moe/cuda.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "moe/device_experts.h"

namespace r3::moe::experts_detail {

// SwiGLU and GPT-OSS's activation, chosen at run time.
struct Activation {
  ExpertActivation::Kind kind;
  float limit, alpha;
  __device__ float operator()(float gate, float up) const {
    const float g = gate > limit ? limit : gate;
    const float u = up > limit ? limit : (up < -limit ? -limit : up);
    if (kind == ExpertActivation::Kind::kSwiglu) return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(g, alpha))));
    return __fmul_rn(__fadd_rn(u, 1.0f), __fmul_rn(g, sig));
  }
};

// Kimi K3's SiTU (ops::situ). The experts kernels take the activation as a template type and are
// instantiated for this one apart: in the same kernels as the others, its branch raised the FP8
// weight-streaming kernel from 128 to 138 registers a thread, which halved its blocks per SM
// (FP8 experts at batch 8: 0.19 -> 0.24 ms a layer) for every model.
struct SituActivation {
  float beta, linear_beta;
  __device__ float operator()(float gate, float up) const {
    const float u = isinf(linear_beta) ? up : linear_beta * tanhf(up / linear_beta);
    return beta * tanhf(gate / beta) * (1.0f / (1.0f + expf(-gate))) * u;
  }
};

struct Grouping {
  const int32_t* offsets;
  const int32_t* order;
  const int32_t* used;
  const int32_t* used_count;
};


#if R3_WITH_CUDA
// The routed experts on tensor cores (sm90_experts_tensor_cores.cu), after the grouping: gate/up
// with the activation into activated [pairs, I], then down into expert_out [pairs, H], for
// `slots` possible used experts; both scratch buffers of expert_scratch_rows(pairs) rows. Only
// for what tensor_cores_fit accepts.
bool tensor_cores_fit(const DeviceExperts& x);
// (Instantiated for Activation and SituActivation.)
template <typename Act>
void experts_on_tensor_cores(cudaStream_t stream, const float* hidden, int64_t k, const Grouping& g,
                             const DeviceExperts& x, const Act& act, int64_t pairs, int64_t slots,
                             int64_t likely_pairs, float* activated, float* expert_out);
#endif

}  // namespace r3::moe::experts_detail
