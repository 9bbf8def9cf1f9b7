// Multi-head latent attention on the GPU (ops/latent_attention.h) over the step's paged cache of
// latents (key rows) and shared rotary keys (value rows), in the CPU kernel's three steps:
// 1. each head's q_nope through its W_k rows into the latent space, next to its rotary part
//    (one thread per output, the sum over q_nope in the CPU's order, products rounded);
// 2. flash-decoding over the cached positions, like the GQA kernel but with every head reading
//    the one latent row: one warp per (token, head, chunk), the key [latent | rotary key], the
//    value the latent, an online softmax per chunk; the chunks merged in order
//    (paged_attention_parts.cuh);
// 3. the attended latent out through the head's W_v rows (one warp per output).
// kv_b stays in the model's dtype (bfloat16 widened exactly in registers), or as the checkpoint
// published it (FP8 or MXFP4, decoded in registers: weight_rows.cuh).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/paged_attention_parts.cuh"
#include "ops/cuda/warp_row_dots.cuh"
#include "ops/latent_attention.h"

namespace r3::ops::cuda {

namespace {

constexpr int kChunkPositions = 64;
constexpr int kMaxLatent = 512;  // kv_lora_rank: 16 elements per lane
constexpr int kMaxRope = 64;     // qk_rope_head_dim: 2 elements per lane

// q_cat[t, h] = [q_nope · W_k (lora) | q_rope (rope)].
template <typename Matrix>
__global__ void latent_queries(const float* __restrict__ q, Matrix kv_b, LatentAttentionShape s,
                               float* __restrict__ q_cat) {
  backend::cuda::wait_for_predecessor();
  const int64_t th = blockIdx.x, h = th % s.heads, width = s.lora + s.rope;
  const float* qh = q + th * (s.nope + s.rope);
  const int64_t first_row = h * (s.nope + s.value);
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    float v;
    if (c < s.lora) {
      v = 0.0f;
      for (int64_t i = 0; i < s.nope; ++i) v = __fadd_rn(v, __fmul_rn(qh[i], load(row_of(kv_b, first_row + i), c)));
    } else {
      v = qh[s.nope + (c - s.lora)];
    }
    q_cat[th * width + c] = v;
  }
}

// One warp per (token, head, chunk): partial max, sum and latent accumulator of the chunk.
template <typename KV, int kPerLane>
__global__ void latent_chunks(const float* __restrict__ q_cat, StepView step, KvPool pool,
                              LatentAttentionShape s, float scale, int64_t chunks, float* __restrict__ part_max,
                              float* __restrict__ part_sum, float* __restrict__ part_acc) {
  backend::cuda::wait_for_predecessor();
  constexpr int kWarpsPerBlock = 4;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= step.tokens * s.heads * chunks) return;
  const int64_t th = warp / chunks, chunk = warp % chunks, t = th / s.heads;
  const int64_t width = s.lora + s.rope;
  float running_max = -INFINITY, running_sum = 0.0f, acc[kPerLane], ql[kPerLane], qr[kMaxRope / kWarp];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t i = lane + j * kWarp;
    acc[j] = 0.0f;
    ql[j] = i < s.lora ? q_cat[th * width + i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kMaxRope / kWarp; ++j) {
    const int64_t i = lane + j * kWarp;
    qr[j] = i < s.rope ? q_cat[th * width + s.lora + i] : 0.0f;
  }
  const int32_t seq = step.seqs[t];
  if (seq >= 0) {
    const int64_t pos = step.positions[t];
    const int64_t first = chunk * kChunkPositions, last = min(pos + 1, first + kChunkPositions);
    for (int64_t p = first; p < last; ++p) {
      const int64_t row = cache_row(step, pool, seq, p);
      const KV* latent = pool_keys<KV>(pool) + row * pool.key_width;
      const KV* rope_key = pool_values<KV>(pool) + row * pool.value_width;
      float lv[kPerLane];
      float partial = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int64_t i = lane + j * kWarp;
        lv[j] = i < s.lora ? load(latent, i) : 0.0f;
        partial += ql[j] * lv[j];
      }
#pragma unroll
      for (int j = 0; j < kMaxRope / kWarp; ++j) {
        const int64_t i = lane + j * kWarp;
        if (i < s.rope) partial += qr[j] * load(rope_key, i);
      }
      const float score = warp_sum(partial) * scale;
      const float new_max = fmaxf(running_max, score);
      const float correction = expf(running_max - new_max);  // 0 when running_max is -inf
      const float weight = expf(score - new_max);
      running_sum = running_sum * correction + weight;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) acc[j] = acc[j] * correction + weight * lv[j];
      running_max = new_max;
    }
  }
  if (lane == 0) {
    part_max[warp] = running_max;
    part_sum[warp] = running_sum;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t i = lane + j * kWarp;
    if (i < s.lora) part_acc[warp * s.lora + i] = acc[j];
  }
}

// out[t, h, i] = W_v[h] row i · latent_out[t, h]: one warp per output.
template <typename Matrix>
__global__ void latent_values(const float* __restrict__ latent_out, Matrix kv_b, LatentAttentionShape s,
                              int64_t outputs, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  constexpr int kWarpsPerBlock = 8;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t o = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (o >= outputs) return;
  const int64_t th = o / s.value, i = o % s.value, h = th % s.heads;
  const auto w_v = row_of(kv_b, h * (s.nope + s.value) + s.nope + i);
  const float* x = latent_out + th * s.lora;
  float partial = 0.0f;
  for (int64_t c = lane; c < s.lora; c += kWarp) partial += load(w_v, c) * x[c];
  partial = warp_sum(partial);
  if (lane == 0) out[o] = partial;
}

template <typename Matrix>
void run(backend::Context& ctx, const Tensor& q, Matrix kv_b, const StepView& step, const KvPool& pool,
         const LatentAttentionShape& s, float scale, Tensor& out) {
  const cudaStream_t stream = ctx.cuda_state().stream;
  const int64_t tokens = step.tokens, th = tokens * s.heads;
  const int64_t chunks = std::max<int64_t>(1, (step.max_context + kChunkPositions - 1) / kChunkPositions);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor q_cat = ctx.scratch_for_output(DType::F32, {th, s.lora + s.rope});
  Tensor part_max = ctx.scratch_for_output(DType::F32, {th * chunks});
  Tensor part_sum = ctx.scratch_for_output(DType::F32, {th * chunks});
  Tensor part_acc = ctx.scratch_for_output(DType::F32, {th * chunks, s.lora});
  Tensor latent_out = ctx.scratch_for_output(DType::F32, {th, s.lora});
  backend::cuda::launch_kernel(latent_queries<Matrix>, static_cast<unsigned>(th), 128, 0, stream, q.data<float>(), kv_b, s,
                               q_cat.data<float>());
  const auto chunk_blocks = static_cast<unsigned>((th * chunks + 3) / 4);
  auto chunked = [&](auto kernel) {
    backend::cuda::launch_kernel(kernel, chunk_blocks, 128, 0, stream, q_cat.data<float>(), step, pool, s, scale,
                                 chunks, part_max.data<float>(), part_sum.data<float>(), part_acc.data<float>());
  };
  with_pool_type(pool, [&](auto kv) {
    using KV = decltype(kv);
    if (s.lora <= 32) chunked(latent_chunks<KV, 1>);
    else if (s.lora <= 128) chunked(latent_chunks<KV, 4>);
    else chunked(latent_chunks<KV, kMaxLatent / kWarp>);
  });
  backend::cuda::launch_kernel(merge_chunks, static_cast<unsigned>(th), merge_threads(s.lora), 0, stream,
                               part_max.data<float>(), part_sum.data<float>(), part_acc.data<float>(), s.heads, s.lora,
                               chunks, nullptr, step.seqs, latent_out.data<float>(), /*release=*/false);
  const int64_t outputs = th * s.value;
  backend::cuda::launch_kernel(latent_values<Matrix>, static_cast<unsigned>((outputs + 7) / 8), 256, 0, stream,
                               latent_out.data<float>(), kv_b, s, outputs, out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void latent_attention_paged(backend::Context& ctx, const Tensor& q, const Tensor& kv_b, const StepView& step,
                            const KvPool& pool, const LatentAttentionShape& s, float scale, Tensor& out) {
  R3_CHECK(step.tokens >= 0 && (step.tokens == 0 || (step.seqs && step.positions && step.block_tables)) &&
               pool.keys && pool.values && pool.block_size > 0,
           "latent attention (cuda): incomplete step metadata or KV pool");
  R3_CHECK(q.rank() == 2 && q.is_contiguous() && q.device() == Device::kCuda && q.dim(0) == step.tokens &&
               q.dim(1) == s.heads * (s.nope + s.rope),
           "latent attention (cuda): q ", shape_to_string(q.shape()), " for ", step.tokens, " tokens");
  R3_CHECK(kv_b.rank() == 2 && kv_b.device() == Device::kCuda && kv_b.dim(0) == s.heads * (s.nope + s.value) &&
               value_shape(kv_b)[1] == s.lora,
           "latent attention (cuda): kv_b ", shape_to_string(kv_b.shape()));
  R3_CHECK(out.rank() == 2 && out.dim(0) == step.tokens && out.dim(1) == s.heads * s.value &&
               out.device() == Device::kCuda,
           "latent attention (cuda): out ", shape_to_string(out.shape()));
  R3_CHECK(s.lora <= kMaxLatent && s.rope <= kMaxRope && pool.key_width == s.lora && pool.value_width == s.rope,
           "latent attention (cuda): kv_lora_rank ", s.lora, " (at most ", kMaxLatent, ") and rope dim ", s.rope,
           " (at most ", kMaxRope, ") over cache rows of ", pool.key_width, " + ", pool.value_width, " floats");
  if (step.tokens * s.heads == 0) return;
  R3_CHECK(step.max_context > 0, "latent attention (cuda): the step's max_context is not set");
  with_weight_matrix(kv_b, [&](auto matrix) { run(ctx, q, matrix, step, pool, s, scale, out); });
}

}  // namespace r3::ops::cuda
