// Pieces shared by the kernels that read or write the paged pools (sm90_paged_attention.cu,
// sm90_latent_attention.cu, sm90_rotary.cu): the pool's element type, the cache row of a
// position through the step's block table, the
// warp max (the warp sum is warp_row_dots.cuh's), and the second half of flash-decoding, where each (token, head)'s chunk partials
// (max, sum of exponentials, weighted sum of values) merge in chunk order into its output row.
// Internal to ops/cuda; each including file gets its own copy of the kernel.
#pragma once

#include <cstdint>

#include "backend/cuda/launch.cuh"
#include "ops/cuda/warp_row_dots.cuh"
#include "ops/step_view.h"

namespace r3::ops::cuda {
namespace {

// Calls f(KV{}) with KV = float or __nv_bfloat16, the pool's element type (ops/step_view.h),
// so that a host function launches the kernel instantiated for it.
template <typename F>
void with_pool_type(const KvPool& pool, F&& f) {
  if (pool.bf16) f(__nv_bfloat16{});
  else f(float{});
}

template <typename KV> __device__ inline KV* pool_keys(const KvPool& pool) { return static_cast<KV*>(pool.keys); }
template <typename KV> __device__ inline KV* pool_values(const KvPool& pool) {
  return static_cast<KV*>(pool.values);
}
// Stores v in the pool's element type (bf16: rounded to nearest even).
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Brings the n elements at p into L2 (one prefetch per 128-byte line).
template <typename KV>
__device__ inline void prefetch_l2(const KV* p, int64_t n) {
  constexpr int64_t kLine = 128 / sizeof(KV);
  for (int64_t i = 0; i < n; i += kLine) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));
}

// By 32-bit division: positions are int32 and non-negative, blocks far smaller (the 64-bit
// division is a long software routine, on the path of every row's load).
__device__ inline int64_t cache_row(const StepView& step, const KvPool& pool, int32_t seq, int64_t pos) {
  const auto p = static_cast<uint32_t>(pos), size = static_cast<uint32_t>(pool.block_size);
  const uint32_t slot = p / size;
  const int32_t block = step.block_tables[seq * step.table_stride + slot];
  return static_cast<int64_t>(block) * pool.block_size + (p - slot * size);
}

__device__ inline float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// A block's warps' partials over a chunk for kG heads (each warp's max, sum of exponentials and
// accumulator of d elements, in shared memory) merged into the chunk's: the max over the warps,
// sums and accumulators rescaled to it, head g's written at max_out[g * stride], sum_out[g *
// stride] and acc_out[g * acc_stride + e] (global memory, for merge_chunks, or the block's shared
// memory, for a merge within a cluster). Called by every
// thread of the block after a barrier. Thread g < kG computes head g's max, sum and each warp's
// rescaling factor once; the elements then only multiply and add (before, each of the kG * d
// elements recomputed its head's max and kWarps exponentials). The same arithmetic.
template <int kWarps, int kG, int kStride>
__device__ inline void write_chunk_partials(const float (&warp_max_of)[kWarps][kG], const float (&warp_sum_of)[kWarps][kG],
                                            const float (&warp_acc)[kWarps][kG][kStride], int64_t d,
                                            float* __restrict__ max_out, float* __restrict__ sum_out, int64_t stride,
                                            float* __restrict__ acc_out, int64_t acc_stride) {
  __shared__ float factor_of[kWarps][kG];  // warp w's rescaling factor for head g; 0: no positions
  if (threadIdx.x < kG) {
    const int g = static_cast<int>(threadIdx.x);
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max_of[w][g]);
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      float f = 0.0f;
      if (warp_sum_of[w][g] != 0.0f) {  // else a warp without positions
        f = expf(warp_max_of[w][g] - m);
        sum += warp_sum_of[w][g] * f;
      }
      factor_of[w][g] = f;
    }
    max_out[g * stride] = m;
    sum_out[g * stride] = sum;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < kG * d; i += blockDim.x) {
    const int g = static_cast<int>(i / d), e = static_cast<int>(i % d);
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_sum_of[w][g] == 0.0f) continue;  // a warp without positions
      a += warp_acc[w][g][e] * factor_of[w][g];
    }
    acc_out[g * acc_stride + e] = a;
  }
}

// Chunks whose partials a merge thread loads in one round.
constexpr int kMergeBatch = 8;
// Up to this many chunks (a batch-1 decode over a 1k context has 16), a merge thread loads every
// chunk's max, sum and accumulator element in one round before it computes anything.
constexpr int kMergeAtOnce = 16;

// One output element from kN chunks' maxima, sums of exponentials and accumulator elements (sums of
// 0: empty chunks, or past the last, skipped): the chunks merged in order, the sink (when given)
// joining the sum. merge_chunks' arithmetic, shared with the merge inside attention's clusters
// (attention_chunks_mma.cuh) so that both give the same bits.
template <int kN>
__device__ inline float merge_element(const float (&mc)[kN], const float (&sc)[kN], const float (&ac)[kN],
                                      const float* sink) {
  float m = sink ? *sink : -INFINITY;
#pragma unroll
  for (int c = 0; c < kN; ++c) m = fmaxf(m, mc[c]);
  float sum = sink ? expf(*sink - m) : 0.0f, acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kN; ++c) {
    if (sc[c] == 0.0f) continue;  // an empty chunk, or past the last
    const float f = expf(mc[c] - m);
    sum += sc[c] * f;
    acc += ac[c] * f;
  }
  return acc / sum;
}

// One block per (token, head), its threads taking the d elements in turn: the chunks merged in
// order, the sink joining the sum. The loads of kMergeBatch chunks are issued before any of them
// is used, so a merge waits a round per kMergeBatch chunks, not two per chunk (the merge is a
// link of a decode step's chain, its time mostly those waits); up to kMergeAtOnce chunks, one
// round in all (the maxima with the rest), the same arithmetic.
__global__ void merge_chunks(const float* __restrict__ part_max, const float* __restrict__ part_sum,
                             const float* __restrict__ part_acc, int64_t heads, int64_t d, int64_t chunks,
                             const float* __restrict__ sinks, const int32_t* __restrict__ seqs, float* __restrict__ out,
                             bool release) {
  backend::cuda::wait_for_predecessor();
  if (release) backend::cuda::release_successor();  // the o projection loads its weights meanwhile
  const int64_t th = blockIdx.x;
  float* o = out + th * d;
  if (seqs[th / heads] < 0) {  // a padding row attends to nothing
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const float* pm = part_max + th * chunks;
  const float* ps = part_sum + th * chunks;
  if (chunks <= kMergeAtOnce) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float mc[kMergeAtOnce], sc[kMergeAtOnce], ac[kMergeAtOnce];
#pragma unroll
      for (int c = 0; c < kMergeAtOnce; ++c) {
        const bool in = c < chunks;
        mc[c] = in ? pm[c] : -INFINITY;
        sc[c] = in ? ps[c] : 0.0f;  // 0: skipped, as an empty chunk (whose accumulator is never written)
        ac[c] = in ? part_acc[(th * chunks + c) * d + i] : 0.0f;
      }
      o[i] = merge_element(mc, sc, ac, sinks ? sinks + th % heads : nullptr);
    }
    return;
  }
  float m = sinks ? sinks[th % heads] : -INFINITY;
  for (int64_t c0 = 0; c0 < chunks; c0 += kMergeBatch) {
    float mc[kMergeBatch];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) mc[u] = c0 + u < chunks ? pm[c0 + u] : -INFINITY;
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) m = fmaxf(m, mc[u]);
  }
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = sinks ? expf(sinks[th % heads] - m) : 0.0f, acc = 0.0f;
    for (int64_t c0 = 0; c0 < chunks; c0 += kMergeBatch) {
      float mc[kMergeBatch], sc[kMergeBatch], ac[kMergeBatch];
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {
        const int64_t c = c0 + u;
        const bool in = c < chunks;
        mc[u] = in ? pm[c] : 0.0f;
        sc[u] = in ? ps[c] : 0.0f;  // 0: skipped, as an empty chunk (whose accumulator is never written)
        ac[u] = in ? part_acc[(th * chunks + c) * d + i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {
        if (sc[u] == 0.0f) continue;  // an empty chunk
        const float f = expf(mc[u] - m);
        sum += sc[u] * f;
        acc += ac[u] * f;
      }
    }
    o[i] = acc / sum;
  }
}

// Threads per merge block: every element of a head of up to 256, then in turns.
inline unsigned merge_threads(int64_t d) { return static_cast<unsigned>(d < 256 ? d : 256); }

}  // namespace
}  // namespace r3::ops::cuda
