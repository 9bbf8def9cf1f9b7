// A sum over a thread block for the CUDA kernels whose block works on one row (a token's head,
// a token's hidden row). Internal to the CUDA code.
#pragma once

namespace r3::ops::cuda {

// The sum of v over the block, the same value on every thread: each warp's sum by shuffles, then
// the warps' sums added in warp order, so a block adds in the same order every time. partials:
// shared memory of blockDim.x / 32 values (blockDim.x a multiple of 32); the first barrier keeps
// a previous call's readers from seeing this call's writes.
template <typename T>
__device__ T block_sum(T v, T* partials) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();
  if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partials[w];
  return total;
}

}  // namespace r3::ops::cuda
