// Paged KV on the GPU: appending a step's key/value rows to the block pool, and grouped-query
// attention of every token over its sequence's cached positions, both through the block tables
// of the step (ops/device_step.h).
//
// Attention: one warp per (token, query head). The warp walks the window's positions in order,
// each lane holding head_dim / 32 elements: a key's dot product is reduced across the warp, and an
// online softmax (running max, running sum, rescaled accumulator) folds each value in, so one
// pass reads every key and value row once. A sink (GPT-OSS) starts the running sum at
// exp(sink - max) with no value. Scores and sums in float32, as on the CPU; the order of the
// additions differs from the CPU's two-pass softmax, hence a tolerance in the tests.
#include <algorithm>

#include "backend/cuda/state.h"
#include "ops/attention.h"
#include "ops/kv_write.h"

namespace r3::ops::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxHeadDim = 256;  // 8 elements per lane
constexpr int kWarpsPerBlock = 4;

__device__ inline int64_t cache_row(const DeviceStep& step, const DeviceKvPool& pool, int32_t seq, int64_t pos) {
  const int32_t block = step.block_tables[seq * step.table_stride + pos / pool.block_size];
  return static_cast<int64_t>(block) * pool.block_size + pos % pool.block_size;
}

__global__ void write_kv_rows(const float* __restrict__ k, int64_t k_stride, const float* __restrict__ v,
                              int64_t v_stride, DeviceStep step, DeviceKvPool pool) {
  const int64_t t = blockIdx.x;
  const int32_t seq = step.seqs[t];
  if (seq < 0) return;  // padding
  const int64_t row = cache_row(step, pool, seq, step.positions[t]);
  for (int64_t i = threadIdx.x; i < pool.key_width; i += blockDim.x) pool.keys[row * pool.key_width + i] = k[t * k_stride + i];
  for (int64_t i = threadIdx.x; i < pool.value_width; i += blockDim.x) {
    pool.values[row * pool.value_width + i] = v[t * v_stride + i];
  }
}

template <int kPerLane>
__global__ void attention_heads(const float* __restrict__ q, DeviceStep step, DeviceKvPool pool, int64_t heads,
                                int64_t kv_heads, int64_t d, float scale, int64_t sliding_window,
                                const float* __restrict__ sinks, float* __restrict__ out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t th = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (th >= step.tokens * heads) return;
  const int64_t t = th / heads, h = th % heads;
  float* o = out + th * d;
  const int32_t seq = step.seqs[t];
  if (seq < 0) {  // a padding row attends to nothing
    for (int64_t i = lane; i < d; i += kWarp) o[i] = 0.0f;
    return;
  }
  const int64_t pos = step.positions[t];
  const int64_t begin = sliding_window > 0 ? max(int64_t{0}, pos - sliding_window + 1) : 0;
  const int64_t kv_offset = (h / (heads / kv_heads)) * d;
  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t i = lane + j * kWarp;
    qv[j] = i < d ? q[th * d + i] : 0.0f;
    acc[j] = 0.0f;
  }
  float running_max = sinks ? sinks[h] : -INFINITY;
  float running_sum = sinks ? 1.0f : 0.0f;  // exp(sink - max) with max = sink
  for (int64_t p = begin; p <= pos; ++p) {
    const int64_t row = cache_row(step, pool, seq, p);
    const float* key = pool.keys + row * pool.key_width + kv_offset;
    const float* value = pool.values + row * pool.value_width + kv_offset;
    float partial = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = lane + j * kWarp;
      if (i < d) partial += qv[j] * key[i];
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) partial += __shfl_xor_sync(0xffffffffu, partial, offset);
    const float score = partial * scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max);  // 0 when running_max is -inf
    const float weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = lane + j * kWarp;
      acc[j] = acc[j] * correction + (i < d ? weight * value[i] : 0.0f);
    }
    running_max = new_max;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t i = lane + j * kWarp;
    if (i < d) o[i] = acc[j] / running_sum;
  }
}

void check_step(const DeviceStep& step, const DeviceKvPool& pool, const char* op) {
  R3_CHECK(step.tokens >= 0 && (step.tokens == 0 || (step.seqs && step.positions && step.block_tables)) &&
               step.table_stride > 0 && pool.keys && pool.values && pool.block_size > 0,
           op, " (cuda): incomplete step metadata or KV pool");
}

}  // namespace

void write_kv_paged(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                    int64_t value_stride, const DeviceStep& step, const DeviceKvPool& pool) {
  check_step(step, pool, "write_kv");
  if (step.tokens == 0) return;
  write_kv_rows<<<static_cast<unsigned>(step.tokens), 128, 0, ctx.cuda_state().stream>>>(keys, key_stride, values,
                                                                                         value_stride, step, pool);
  R3_CUDA_CHECK(cudaGetLastError());
}

void paged_attention(backend::Context& ctx, const Tensor& q, const DeviceStep& step, const DeviceKvPool& pool,
                     int64_t num_kv_heads, float scale, int64_t sliding_window, const float* sinks, Tensor& out) {
  check_step(step, pool, "attention");
  R3_CHECK(q.rank() == 3 && q.is_contiguous() && out.shape() == q.shape() && q.device() == Device::kCuda &&
               out.device() == Device::kCuda && q.dim(0) == step.tokens,
           "attention (cuda): q ", shape_to_string(q.shape()), " out ", shape_to_string(out.shape()), " for ",
           step.tokens, " tokens");
  const int64_t heads = q.dim(1), d = q.dim(2);
  R3_CHECK(num_kv_heads > 0 && heads % num_kv_heads == 0 && d <= kMaxHeadDim &&
               pool.key_width >= num_kv_heads * d && pool.value_width >= num_kv_heads * d,
           "attention (cuda): ", heads, " heads of ", d, " over ", num_kv_heads, " kv heads and rows of ",
           pool.key_width, " floats (head_dim at most ", kMaxHeadDim, ")");
  const int64_t warps = step.tokens * heads;
  if (warps == 0) return;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t stream = ctx.cuda_state().stream;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(q.data<float>(), step, pool, heads, num_kv_heads, d, scale,
                                                          sliding_window, sinks, out.data<float>());
  };
  if (d <= 64) launch(attention_heads<2>);
  else if (d <= 128) launch(attention_heads<4>);
  else launch(attention_heads<8>);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
