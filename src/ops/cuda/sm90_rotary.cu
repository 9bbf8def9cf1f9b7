// Rotary embedding on the GPU, the CPU's arithmetic: angle = float(position) * inv_freq[i] in
// float32, its cosine and sine in double rounded to float, times attention_scaling, then the pair
// update with each product rounded (no fused multiply-add). Two layouts: "rotate half" (pairs
// (i, i + half) of the leading rotary dims, ops/rotary.h) and DeepSeek's trailing interleaved one
// (pairs (2i, 2i + 1) of the trailing rope dims, ops/interleaved_rotary.h). One block per token,
// positions from the step's device metadata. rotary_and_write_kv also writes the rotated keys and
// the values to the paged pool after the rotation, in the same block (one kernel for three).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/interleaved_rotary.h"
#include "ops/cuda/paged_attention_parts.cuh"
#include "ops/rotary.h"

namespace r3::ops::cuda {

namespace {

constexpr int kMaxHalf = 256;  // rotary_dim up to 512

struct Frequencies {
  float inv_freq[kMaxHalf];
};

// Rotates pair i of every head of one token's row x [heads, head_dim] by the token's position.
template <bool kInterleavedTail>
__device__ inline void rotate_pair(float* x, int64_t heads, int64_t head_dim, int64_t half, int64_t i, float c,
                                   float s) {
  // The pair's two elements.
  const int64_t first = kInterleavedTail ? head_dim - 2 * half + 2 * i : i;
  const int64_t second = kInterleavedTail ? first + 1 : i + half;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    const float a = v[first], b = v[second];
    // Rounded products, then the sum: no fused multiply-add, as on the CPU.
    v[first] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[second] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

// cos and sin of pair i's angle at `position`, times the scaling.
__device__ inline void angle(float position, const Frequencies& freq, int64_t i, float scaling, float* c, float* s) {
  const float a = position * freq.inv_freq[i];
  *c = __fmul_rn(static_cast<float>(cos(static_cast<double>(a))), scaling);
  *s = __fmul_rn(static_cast<float>(sin(static_cast<double>(a))), scaling);
}

template <bool kInterleavedTail>
__global__ void rotate_heads(float* __restrict__ x, int64_t heads, int64_t head_dim, int64_t half,
                             const int32_t* __restrict__ positions, Frequencies freq, float scaling) {
  backend::cuda::wait_for_predecessor();
  const int64_t t = blockIdx.x;
  const float position = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float c, s;
    angle(position, freq, i, scaling, &c, &s);
    rotate_pair<kInterleavedTail>(x + t * heads * head_dim, heads, head_dim, half, i, c, s);
  }
}

// Rotates token t's query and key heads, then writes its key and value rows to the pool.
__global__ void rotate_and_write(float* __restrict__ q, int64_t q_heads, float* __restrict__ k, int64_t kv_heads,
                                 const float* __restrict__ v, int64_t head_dim, int64_t half, DeviceStep step,
                                 DeviceKvPool pool, Frequencies freq, float scaling) {
  backend::cuda::wait_for_predecessor();
  const int64_t t = blockIdx.x;
  const float position = static_cast<float>(step.positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float c, s;
    angle(position, freq, i, scaling, &c, &s);
    rotate_pair<false>(q + t * q_heads * head_dim, q_heads, head_dim, half, i, c, s);
    rotate_pair<false>(k + t * kv_heads * head_dim, kv_heads, head_dim, half, i, c, s);
  }
  __syncthreads();  // the rotated keys, written by other threads, are what the pool gets
  const int32_t seq = step.seqs[t];
  if (seq < 0) return;  // padding
  const int64_t row = cache_row(step, pool, seq, step.positions[t]);
  const int64_t width = kv_heads * head_dim;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    pool.keys[row * pool.key_width + i] = k[t * width + i];
    pool.values[row * pool.value_width + i] = v[t * width + i];
  }
}

Frequencies frequencies(std::span<const float> inv_freq, int64_t half) {
  Frequencies freq{};
  for (int64_t i = 0; i < half; ++i) freq.inv_freq[i] = inv_freq[static_cast<std::size_t>(i)];
  return freq;
}

template <bool kInterleavedTail>
void rotate(backend::Context& ctx, int64_t rotary_dim, std::span<const float> inv_freq, float scaling, Tensor& x,
            const int32_t* positions) {
  R3_CHECK(x.rank() == 3 && x.is_contiguous() && x.device() == Device::kCuda,
           "rotary (cuda): x must be a [tokens, heads, head_dim] device tensor");
  const int64_t tokens = x.dim(0), heads = x.dim(1), head_dim = x.dim(2), half = rotary_dim / 2;
  R3_CHECK(head_dim >= rotary_dim && half <= kMaxHalf, "rotary (cuda): head_dim ", head_dim, ", rotary dim ",
           rotary_dim, " (at most ", 2 * kMaxHalf, ")");
  if (tokens == 0 || half == 0) return;
  const Frequencies freq = frequencies(inv_freq, half);
  backend::cuda::launch_kernel(rotate_heads<kInterleavedTail>, static_cast<unsigned>(tokens), 64, 0,
                               ctx.cuda_state().stream, x.data<float>(), heads, head_dim, half, positions, freq,
                               scaling);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rotary_positions_on_device(backend::Context& ctx, const Rotary& rotary, Tensor& x, const int32_t* positions) {
  rotate<false>(ctx, rotary.rotary_dim(), rotary.inv_freq(), rotary.attention_scaling(), x, positions);
}

void interleaved_rotary_on_device(backend::Context& ctx, const TrailingInterleavedRotary& rotary, Tensor& x,
                                  const int32_t* positions) {
  rotate<true>(ctx, rotary.rope_dim(), rotary.inv_freq(), rotary.attention_scaling(), x, positions);
}

void rotary_and_write_kv(backend::Context& ctx, const Rotary& rotary, Tensor& q, Tensor& k, const Tensor& v,
                         const DeviceStep& step, const DeviceKvPool& pool) {
  R3_CHECK(q.rank() == 3 && k.rank() == 3 && q.is_contiguous() && k.is_contiguous() && v.is_contiguous() &&
               q.dim(0) == step.tokens && k.dim(0) == step.tokens && q.dim(2) == k.dim(2) &&
               v.numel() == k.numel() && q.device() == Device::kCuda && k.device() == Device::kCuda &&
               v.device() == Device::kCuda,
           "rotary_and_write_kv (cuda): q ", shape_to_string(q.shape()), " k ", shape_to_string(k.shape()), " v ",
           shape_to_string(v.shape()), " for ", step.tokens, " tokens");
  const int64_t head_dim = k.dim(2), half = rotary.rotary_dim() / 2, width = k.dim(1) * head_dim;
  R3_CHECK(head_dim >= rotary.rotary_dim() && half <= kMaxHalf && pool.key_width >= width &&
               pool.value_width >= width && pool.keys && pool.values && pool.block_size > 0 &&
               (step.tokens == 0 || (step.seqs && step.positions && step.block_tables)),
           "rotary_and_write_kv (cuda): head_dim ", head_dim, ", rotary dim ", rotary.rotary_dim(), ", pool rows of ",
           pool.key_width, " + ", pool.value_width, " floats for ", width);
  if (step.tokens == 0) return;
  backend::cuda::launch_kernel(rotate_and_write, static_cast<unsigned>(step.tokens), 128, 0, ctx.cuda_state().stream,
                               q.data<float>(), q.dim(1), k.data<float>(), k.dim(1), v.data<float>(), head_dim, half,
                               step, pool, frequencies(rotary.inv_freq(), half), rotary.attention_scaling());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
