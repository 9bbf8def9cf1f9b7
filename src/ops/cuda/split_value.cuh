// One float32 value split into high and low bfloat16 parts (ops/cuda/split_bf16.h says why): the
// one place the kernels that split take the arithmetic from, so that every split gives the same bits.
#pragma once

#include <cuda_bf16.h>

namespace r3::ops::cuda {

// hi = bf16(v); lo = bf16(v - hi), the difference exact in float32 and rounded once.
struct SplitValue {
  __nv_bfloat16 hi, lo;
};
__device__ inline SplitValue split_value(float v) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  return {hi, __float2bfloat16_rn(v - __bfloat162float(hi))};
}

}  // namespace r3::ops::cuda
