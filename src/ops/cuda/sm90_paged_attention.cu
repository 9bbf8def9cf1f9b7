// Paged KV on the GPU: appending a step's key/value rows to the block pool, and grouped-query
// attention of every token over its sequence's cached positions, both through the block tables
// of the step (ops/device_step.h).
//
// Attention splits each token's window into chunks of positions (flash-decoding): one warp
// per (token, query head, chunk) walks its chunk in order, each lane holding head_dim / 32
// elements; a key's dot product is reduced across the warp, and an online softmax (running max,
// running sum, rescaled accumulator) folds each value in. A second kernel merges the chunks of
// each (token, head) in chunk order, adding a sink's exp(sink - max) to the sum (GPT-OSS). The
// chunk size is fixed, so how a window is split depends only on its length: a token's result does
// not depend on the batch. Scores and sums in float32; the order of the additions differs from
// the CPU's two-pass softmax, hence a tolerance in the tests.
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

// Positions per warp. Each position is a dependent chain (block table, key row, shuffle
// reduction, softmax update), so a warp's time grows with its chunk: few (token, head) pairs need
// short chunks to give the GPU enough warps, many pairs run faster with long ones (fewer partial
// results to write and merge). Measured on the H200 at a 1k context: 32 pairs, 0.039 ms with 16
// positions against 0.051 with 64; 256 pairs, 0.084 ms with 64 against 0.104 with 16.
int64_t chunk_positions(int64_t token_heads) { return token_heads < 256 ? 16 : 64; }

// One warp per (token, head, chunk): partial max, sum and accumulator of its chunk (max -inf and
// sum 0 for a chunk past the window or a padding row).
template <int kPerLane>
__global__ void attention_chunks(const float* __restrict__ q, DeviceStep step, DeviceKvPool pool, int64_t heads,
                                 int64_t kv_heads, int64_t d, float scale, int64_t sliding_window, int64_t chunk_len,
                                 int64_t chunks,
                                 float* __restrict__ part_max, float* __restrict__ part_sum, float* __restrict__ part_acc) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= step.tokens * heads * chunks) return;
  const int64_t th = warp / chunks, chunk = warp % chunks;
  const int64_t t = th / heads, h = th % heads;
  float running_max = -INFINITY, running_sum = 0.0f, acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) acc[j] = 0.0f;
  const int32_t seq = step.seqs[t];
  if (seq >= 0) {
    const int64_t pos = step.positions[t];
    const int64_t begin = sliding_window > 0 ? max(int64_t{0}, pos - sliding_window + 1) : 0;
    const int64_t first = begin + chunk * chunk_len, last = min(pos + 1, first + chunk_len);
    const int64_t kv_offset = (h / (heads / kv_heads)) * d;
    float qv[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = lane + j * kWarp;
      qv[j] = i < d ? q[th * d + i] : 0.0f;
    }
    for (int64_t p = first; p < last; ++p) {
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
  }
  if (lane == 0) {
    part_max[warp] = running_max;
    part_sum[warp] = running_sum;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t i = lane + j * kWarp;
    if (i < d) part_acc[warp * d + i] = acc[j];
  }
}

// One block of d threads per (token, head): the chunks merged in order, the sink joining the sum.
__global__ void merge_chunks(const float* __restrict__ part_max, const float* __restrict__ part_sum,
                             const float* __restrict__ part_acc, int64_t heads, int64_t d, int64_t chunks,
                             const float* __restrict__ sinks, const int32_t* __restrict__ seqs, float* __restrict__ out) {
  const int64_t th = blockIdx.x, i = threadIdx.x;
  if (i >= d) return;
  float* o = out + th * d;
  if (seqs[th / heads] < 0) {  // a padding row attends to nothing
    o[i] = 0.0f;
    return;
  }
  const float* pm = part_max + th * chunks;
  const float* ps = part_sum + th * chunks;
  float m = sinks ? sinks[th % heads] : -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, pm[c]);
  float sum = sinks ? expf(sinks[th % heads] - m) : 0.0f, acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    if (ps[c] == 0.0f) continue;  // an empty chunk
    const float f = expf(pm[c] - m);
    sum += ps[c] * f;
    acc += part_acc[(th * chunks + c) * d + i] * f;
  }
  o[i] = acc / sum;
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
  if (step.tokens * heads == 0) return;
  R3_CHECK(step.max_context > 0, "attention (cuda): the step's max_context is not set");
  // Chunks: enough for the longest window of the step (the step's largest position + 1).
  const int64_t longest = sliding_window > 0 ? std::min(step.max_context, sliding_window) : step.max_context;
  // A batch-invariant context keeps one chunk length: a token's chunks, and so the order its
  // partial softmaxes merge in, must not depend on the other tokens of the step.
  const int64_t chunk_len = ctx.batch_invariant() ? 64 : chunk_positions(step.tokens * heads);
  const int64_t chunks = std::max<int64_t>(1, (longest + chunk_len - 1) / chunk_len);
  const int64_t warps = step.tokens * heads * chunks;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor part_max = ctx.scratch(DType::F32, {warps}), part_sum = ctx.scratch(DType::F32, {warps});
  Tensor part_acc = ctx.scratch(DType::F32, {warps, d});
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t stream = ctx.cuda_state().stream;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(q.data<float>(), step, pool, heads, num_kv_heads, d, scale,
                                                          sliding_window, chunk_len, chunks, part_max.data<float>(),
                                                          part_sum.data<float>(), part_acc.data<float>());
  };
  if (d <= 64) launch(attention_chunks<2>);
  else if (d <= 128) launch(attention_chunks<4>);
  else launch(attention_chunks<8>);
  merge_chunks<<<static_cast<unsigned>(step.tokens * heads), static_cast<unsigned>(d), 0, stream>>>(
      part_max.data<float>(), part_sum.data<float>(), part_acc.data<float>(), heads, d, chunks, sinks, step.seqs,
      out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
