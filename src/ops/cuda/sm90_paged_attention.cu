// Paged KV on the GPU: appending a step's key/value rows to the block pool, and grouped-query
// attention of every token over its sequence's cached positions, both through the block tables
// of the step (ops/device_step.h).
//
// Attention splits each token's window into chunks of kChunk positions (flash-decoding). One
// block per (token, group of query heads sharing a KV head, chunk) loads each key and value row
// of its chunk once for all the group's heads (GQA: 8 query heads per KV head in Qwen3-30B-A3B),
// in three phases: scores (each warp a quarter of the chunk's positions, all its key rows loaded
// before any is used, a head's dot product reduced across the warp), the chunk's softmax per head
// (one lane per position: max, exponentials, sum), and the weighted sum of the value rows (one
// thread per head dimension, every head's accumulator in registers). A second kernel merges the
// chunks of each (token, head) in chunk order, adding a sink's exp(sink - max) to the sum
// (GPT-OSS). The chunk length is fixed, so how a window is split depends only on its length: a
// token's result does not depend on the batch (batch invariant by construction). Scores and sums
// in float32; the order of the additions differs from the CPU's two-pass softmax, hence a
// tolerance in the tests.
#include <algorithm>

#include "backend/cuda/state.h"
#include "ops/attention.h"
#include "ops/cuda/paged_attention_parts.cuh"
#include "ops/kv_write.h"

namespace r3::ops::cuda {

namespace {

constexpr int kMaxHeadDim = 256;  // 8 elements per lane

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

constexpr int kChunk = kWarp;  // positions per block: phase 2 gives each lane one
constexpr int kBlockWarps = 4;
constexpr int kPositionsPerWarp = kChunk / kBlockWarps;
constexpr int kMaxGroup = 16;  // query heads per block

// One block per (token, head group, chunk): each head's partial max, sum and accumulator over the
// chunk (max -inf and sum 0 for a chunk past the window or a padding row).
template <int kPerLane>
__global__ void attention_chunks(const float* __restrict__ q, DeviceStep step, DeviceKvPool pool, int64_t heads,
                                 int64_t kv_heads, int64_t group, int64_t d, float scale, int64_t sliding_window,
                                 int64_t chunks, float* __restrict__ part_max, float* __restrict__ part_sum,
                                 float* __restrict__ part_acc) {
  __shared__ float weights[kMaxGroup][kChunk];  // scores, then their exponentials
  __shared__ int64_t rows[kChunk];
  extern __shared__ float q_group[];  // [group, d]
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t groups_per_token = heads / group;
  const int64_t chunk = blockIdx.x % chunks, tg = blockIdx.x / chunks;
  const int64_t t = tg / groups_per_token, first_head = (tg % groups_per_token) * group;
  const int64_t kv_offset = (first_head / (heads / kv_heads)) * d;
  const int32_t seq = step.seqs[t];
  int64_t first = 0, count = 0;
  if (seq >= 0) {
    const int64_t pos = step.positions[t];
    const int64_t begin = sliding_window > 0 ? max(int64_t{0}, pos - sliding_window + 1) : 0;
    first = begin + chunk * kChunk;
    count = max(int64_t{0}, min(pos + 1, first + kChunk) - first);
  }
  const int64_t part = (t * heads + first_head) * chunks + chunk;  // head g's is part + g * chunks
  if (count == 0) {
    for (int64_t g = threadIdx.x; g < group; g += blockDim.x) {
      part_max[part + g * chunks] = -INFINITY;
      part_sum[part + g * chunks] = 0.0f;  // the merge skips the chunk: its accumulator is never read
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < group * d; i += blockDim.x) q_group[i] = q[(t * heads + first_head) * d + i];
  if (threadIdx.x < count) rows[threadIdx.x] = cache_row(step, pool, seq, first + threadIdx.x);
  __syncthreads();

  // Scores: this warp's key rows loaded together, then each head's dot products.
  float key[kPositionsPerWarp][kPerLane];
#pragma unroll
  for (int pp = 0; pp < kPositionsPerWarp; ++pp) {
    const int p = warp + pp * kBlockWarps;
    const float* k_row = pool.keys + rows[p < count ? p : 0] * pool.key_width + kv_offset;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = lane + j * kWarp;
      key[pp][j] = p < count && i < d ? k_row[i] : 0.0f;
    }
  }
#pragma unroll
  for (int pp = 0; pp < kPositionsPerWarp; ++pp) {
    const int p = warp + pp * kBlockWarps;
    if (p >= count) break;
    for (int64_t g = 0; g < group; ++g) {
      float partial = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int64_t i = lane + j * kWarp;
        if (i < d) partial += q_group[g * d + i] * key[pp][j];
      }
      partial = warp_sum(partial);
      if (lane == 0) weights[g][p] = partial * scale;
    }
  }
  __syncthreads();

  // The chunk's softmax per head: one lane per position.
  for (int64_t g = warp; g < group; g += kBlockWarps) {
    const float score = lane < count ? weights[g][lane] : -INFINITY;
    const float m = warp_max(score);
    const float e = lane < count ? expf(score - m) : 0.0f;
    const float sum = warp_sum(e);
    weights[g][lane] = e;
    if (lane == 0) {
      part_max[part + g * chunks] = m;
      part_sum[part + g * chunks] = sum;
    }
  }
  __syncthreads();

  // The weighted value rows: one thread per head dimension, every head of the group at once.
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float acc[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
#pragma unroll 4
    for (int p = 0; p < count; ++p) {
      const float v = pool.values[rows[p] * pool.value_width + kv_offset + i];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) acc[g] += weights[g][p] * v;
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) part_acc[(part + g * chunks) * d + i] = acc[g];
    }
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
  if (step.tokens * heads == 0) return;
  R3_CHECK(step.max_context > 0, "attention (cuda): the step's max_context is not set");
  // Chunks: enough for the longest window of the step (the step's largest position + 1).
  const int64_t longest = sliding_window > 0 ? std::min(step.max_context, sliding_window) : step.max_context;
  const int64_t chunks = std::max<int64_t>(1, (longest + kChunk - 1) / kChunk);
  // Query heads per block: the KV head's whole group, or the largest divisor of it that fits.
  int64_t group = heads / num_kv_heads;
  while (group > kMaxGroup || (heads / num_kv_heads) % group != 0) --group;
  const int64_t parts = step.tokens * heads * chunks;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor part_max = ctx.scratch_for_output(DType::F32, {parts}), part_sum = ctx.scratch_for_output(DType::F32, {parts});
  Tensor part_acc = ctx.scratch_for_output(DType::F32, {parts, d});
  const auto blocks = static_cast<unsigned>(step.tokens * (heads / group) * chunks);
  const auto q_bytes = static_cast<std::size_t>(group * d) * sizeof(float);
  const cudaStream_t stream = ctx.cuda_state().stream;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kBlockWarps * kWarp, q_bytes, stream>>>(q.data<float>(), step, pool, heads, num_kv_heads, group,
                                                             d, scale, sliding_window, chunks, part_max.data<float>(),
                                                             part_sum.data<float>(), part_acc.data<float>());
  };
  if (d <= 64) launch(attention_chunks<2>);
  else if (d <= 128) launch(attention_chunks<4>);
  else launch(attention_chunks<8>);
  merge_chunks<<<static_cast<unsigned>(step.tokens * heads), merge_threads(d), 0, stream>>>(
      part_max.data<float>(), part_sum.data<float>(), part_acc.data<float>(), heads, d, chunks, sinks, step.seqs,
      out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
