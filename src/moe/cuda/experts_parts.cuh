// Pieces shared by the two fused experts paths (sm90_fused_experts.cu: weight-streaming rows;
// sm90_experts_tensor_cores.cu: bfloat16 tensor cores): the experts' activations, the step's
// (token, choice) pairs grouped by expert, and the tensor-core path's entry. Internal to moe/cuda.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "moe/device_experts.h"
#include "ops/cuda/weight_matrices.h"

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

// The experts' activation as the kernels' type, handed to run(activation): each kind is its own
// kernel instantiation.
template <typename Run>
void with_activation(const ExpertActivation& a, Run&& run) {
  if (a.kind == ExpertActivation::Kind::kSitu) run(SituActivation{a.beta, a.linear_beta});
  else run(Activation{a.kind, a.limit, a.alpha});
}

// The experts' gate, up and down matrices as the weight-streaming kernels read them (every
// expert's matrix stacked; FP8 with each expert's own grid of block scales, partial last blocks
// included), handed to run(gate, up, down).
template <typename Run>
void with_expert_matrices(const DeviceExperts& x, Run&& run) {
  using ops::cuda::Fp8Matrix;
  using ops::cuda::Mxfp4Matrix;
  using ops::cuda::PlainMatrix;
  const int64_t h = x.hidden(), inter = x.intermediate();
  const auto bytes = [](const Tensor& t) { return static_cast<const uint8_t*>(t.raw_data()); };
  switch (x.gate.dtype()) {
    case DType::F32:
      return run(PlainMatrix<float>{x.gate.data<float>(), h}, PlainMatrix<float>{x.up.data<float>(), h},
                 PlainMatrix<float>{x.down.data<float>(), inter});
    case DType::BF16: {
      const auto bf16 = [](const Tensor& t, int64_t cols) {
        return PlainMatrix<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(t.raw_data()), cols};
      };
      return run(bf16(x.gate, h), bf16(x.up, h), bf16(x.down, inter));
    }
    case DType::F8_E4M3: {
      const auto fp8 = [&](const Tensor& values, const Tensor& scales, int64_t cols) {
        return ops::cuda::fp8_matrix(bytes(values), scales.data<float>(), values.dim(0) * values.dim(1), cols,
                                     values.dim(1), scales.dim(1), scales.dim(2), 0, x.block_rows, x.block_cols);
      };
      return run(fp8(x.gate, x.gate_scales, h), fp8(x.up, x.up_scales, h), fp8(x.down, x.down_scales, inter));
    }
    case DType::F4_E2M1X2:
      return run(Mxfp4Matrix{bytes(x.gate), bytes(x.gate_scales), h}, Mxfp4Matrix{bytes(x.up), bytes(x.up_scales), h},
                 Mxfp4Matrix{bytes(x.down), bytes(x.down_scales), inter});
    default: R3_FAIL("experts (cuda): weights of dtype ", dtype_name(x.gate.dtype()));
  }
}

// Whether the experts' rows take eight-value loads: every row starts on a multiple of 8 values
// (buffers are 256-byte aligned) and FP8 blocks are a power of two of at least 8 wide
// (weights_vec8's condition).
inline bool experts_vec8(const DeviceExperts& x) {
  return x.hidden() % 8 == 0 && x.intermediate() % 8 == 0 &&
         (x.block_cols == 0 || (x.block_cols >= 8 && ops::cuda::fp8_block_cols_shift(x.block_cols) >= 0));
}

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
// for what tensor_cores_fit accepts: FP8 experts only in a step of reduced precision
// (Context::reduced_precision).
bool tensor_cores_fit(const DeviceExperts& x, bool reduced_precision);
// (Instantiated for Activation and SituActivation.)
template <typename Act>
void experts_on_tensor_cores(cudaStream_t stream, const float* hidden, int64_t k, const Grouping& g,
                             const DeviceExperts& x, const Act& act, int64_t pairs, int64_t slots,
                             int64_t likely_pairs, float* activated, float* expert_out);
#endif

}  // namespace r3::moe::experts_detail
