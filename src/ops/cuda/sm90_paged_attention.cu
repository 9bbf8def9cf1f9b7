// Paged KV on the GPU: appending a step's key/value rows to the block pool, and grouped-query
// attention of every token over its sequence's cached positions, both through the block tables
// of the step (ops/step_view.h).
//
// Attention splits each token's window into chunks (flash-decoding). One block per (token, group
// of query heads sharing a KV head, chunk) reads each key and value row of its chunk once for all
// the group's heads (GQA: 8 query heads per KV head in Qwen3-30B-A3B). Its warps take the chunk's
// 32-position tiles in turn, each keeping an online softmax per head: every lane owns d / 32
// consecutive dimensions of every head's query and accumulator, so key and value rows are read
// whole by the warp (128-bit loads of float32 rows of head_dim 128, 64-bit ones of bf16 rows),
// four rows in flight at once. A tile's
// scores meet across the lanes in a reduce-scatter (the group's heads summed together: G - 1 + 5
// - log2 G shuffles per position instead of 5 G), its softmax runs one lane per position, and its
// probabilities, through shared memory, weight the value rows. The warps' partials merge in
// shared memory into the chunk's (max, sum, accumulator); a second kernel merges the chunks of
// each (token, head) in chunk order, adding a sink's exp(sink - max) to the sum (GPT-OSS).
//
// A bf16 pool of head size 64 or 128 takes the same blocks and partials on tensor cores
// instead (attention_chunks_mma.cuh; 64-position chunks at least); other pools and sizes run the
// per-lane kernel below, which widens bf16 rows as it loads them.
//
// The chunk length is 128 positions with --batch-invariant (how a window is split then depends
// only on its length, so a token's result does not depend on the batch); otherwise up to 1024,
// as long as the step still has two blocks per SM, so that large batches write and merge fewer
// partials. Scores and sums in float32; the order of the additions differs from the CPU's
// two-pass softmax, hence a tolerance in the tests.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/attention.h"
#include "ops/cuda/attention_chunks_mma.cuh"
#include "ops/cuda/paged_attention_parts.cuh"
#include "ops/kv_write.h"

namespace r3::ops::cuda {

namespace {

constexpr int kMaxHeadDim = 256;  // 8 elements per lane

template <typename KV>
__global__ void write_kv_rows(const float* __restrict__ k, int64_t k_stride, const float* __restrict__ v,
                              int64_t v_stride, StepView step, KvPool pool) {
  backend::cuda::wait_for_predecessor();
  const int64_t t = blockIdx.x;
  const int32_t seq = step.seqs[t];
  if (seq < 0) return;  // padding
  const int64_t row = cache_row(step, pool, seq, step.positions[t]);
  KV* keys = pool_keys<KV>(pool) + row * pool.key_width;
  KV* values = pool_values<KV>(pool) + row * pool.value_width;
  for (int64_t i = threadIdx.x; i < pool.key_width; i += blockDim.x) store(keys, i, k[t * k_stride + i]);
  for (int64_t i = threadIdx.x; i < pool.value_width; i += blockDim.x) store(values, i, v[t * v_stride + i]);
}

constexpr int kTile = kWarp;    // positions per warp tile: the softmax gives each lane one
constexpr int kBlockWarps = 4;
constexpr int kMaxGroup = 8;     // query heads per block

// A lane's kD consecutive elements of a row (from `dim`, zeros past d), widened to float32: one
// or two 128-bit loads (float32) or one 64/128-bit load (bf16) when kVec (d == 32 kD, rows
// 16-byte aligned), element loads otherwise.
template <int kD, bool kVec>
__device__ inline void load_dims(const float* row, int dim, int64_t d, float (&out)[kD]) {
  if constexpr (kVec) {
#pragma unroll
    for (int i = 0; i < kD; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(row + dim + i);
      out[i] = v.x; out[i + 1] = v.y; out[i + 2] = v.z; out[i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kD; ++i) out[i] = dim + i < d ? row[dim + i] : 0.0f;
  }
}

template <int kD, bool kVec>
__device__ inline void load_dims(const __nv_bfloat16* row, int dim, int64_t d, float (&out)[kD]) {
  if constexpr (kVec) {
    static_assert(kD == 4 || kD == 8, "vector loads of 4 or 8 bf16");
    __nv_bfloat162 pairs[kD / 2];
    if constexpr (kD == 4) *reinterpret_cast<uint2*>(pairs) = *reinterpret_cast<const uint2*>(row + dim);
    else *reinterpret_cast<uint4*>(pairs) = *reinterpret_cast<const uint4*>(row + dim);
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kD; ++i) out[i] = dim + i < d ? __bfloat162float(row[dim + i]) : 0.0f;
  }
}

// v[h] summed over the warp's lanes, for kG heads at once: halving exchanges leave lane l with
// head l % kG summed over its kG-lane group (kG - 1 shuffles), then the groups add up.
template <int kG>
__device__ inline float reduce_scatter(float (&v)[kG], int lane) {
#pragma unroll
  for (int half = kG / 2; half >= 1; half /= 2) {
    const bool upper = (lane & half) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float received = __shfl_xor_sync(0xffffffffu, upper ? v[i] : v[i + half], half);
      v[i] = (upper ? v[i + half] : v[i]) + received;
    }
  }
  float sum = v[0];
#pragma unroll
  for (int offset = kG; offset < kWarp; offset *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

// One block per (token, head group, chunk of `chunk_len` positions): each head's partial max, sum
// and accumulator over the chunk (max -inf and sum 0 for a chunk past the window or a padding row).
template <typename KV, int kG, int kD, bool kVec>
__global__ void __launch_bounds__(kBlockWarps * kWarp)
    attention_chunks(const float* __restrict__ q, StepView step, KvPool pool, int64_t heads, int64_t kv_heads,
                     int64_t d, float scale, int64_t sliding_window, int64_t chunks, int64_t chunk_len,
                     float* __restrict__ part_max, float* __restrict__ part_sum, float* __restrict__ part_acc) {
  backend::cuda::wait_for_predecessor();
  __shared__ float probs[kBlockWarps][kTile][kG];  // a tile's scores, then their exponentials
  __shared__ float warp_max_of[kBlockWarps][kG], warp_sum_of[kBlockWarps][kG];
  __shared__ float warp_acc[kBlockWarps][kG][kD * kWarp];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t groups_per_token = heads / kG;
  const int64_t chunk = blockIdx.x % chunks, tg = blockIdx.x / chunks;
  const int64_t t = tg / groups_per_token, first_head = (tg % groups_per_token) * kG;
  const int64_t kv_offset = (first_head / (heads / kv_heads)) * d;
  const int32_t seq = step.seqs[t];
  int64_t first = 0, count = 0;
  if (seq >= 0) {
    const int64_t pos = step.positions[t];
    const int64_t begin = sliding_window > 0 ? max(int64_t{0}, pos - sliding_window + 1) : 0;
    first = begin + chunk * chunk_len;
    count = max(int64_t{0}, min(pos + 1, first + chunk_len) - first);
  }
  const int64_t part = (t * heads + first_head) * chunks + chunk;  // head g's is part + g * chunks
  if (count == 0) {
    for (int g = static_cast<int>(threadIdx.x); g < kG; g += static_cast<int>(blockDim.x)) {
      part_max[part + g * chunks] = -INFINITY;
      part_sum[part + g * chunks] = 0.0f;  // the merge skips the chunk: its accumulator is never read
    }
    return;
  }
  // Key or value rows a lane loads before using them (fewer for the widest heads: registers).
  constexpr int kRowsInFlight = kD >= 8 ? 4 : 8;
  const int dim = lane * kD;
  float qr[kG][kD], acc[kG][kD], run_max[kG], lane_sum[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    load_dims<kD, kVec>(q + (t * heads + first_head + g) * d, dim, d, qr[g]);
    run_max[g] = -INFINITY;
    lane_sum[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kD; ++i) acc[g][i] = 0.0f;
  }
  const KV* keys = pool_keys<KV>(pool) + kv_offset;
  const KV* values = pool_values<KV>(pool) + kv_offset;

  for (int64_t tile_first = static_cast<int64_t>(warp) * kTile; tile_first < count; tile_first += kBlockWarps * kTile) {
    const int n = static_cast<int>(min(int64_t{kTile}, count - tile_first));
    const int64_t my_row = lane < n ? cache_row(step, pool, seq, first + tile_first + lane) : 0;
    // Each lane asks L2 for its position's key and value head at once, so that the rounds of
    // loads below wait on L2 rather than on memory (a decode step of few sequences is a chain of
    // such rounds; the arithmetic is unchanged).
    if (lane < n) {
      prefetch_l2(keys + my_row * pool.key_width, d);
      prefetch_l2(values + my_row * pool.value_width, d);
    }
    // Scores, kRowsInFlight key rows at a time.
    for (int j0 = 0; j0 < n; j0 += kRowsInFlight) {
      float key[kRowsInFlight][kD];
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        const int64_t row = __shfl_sync(0xffffffffu, my_row, (j0 + j) % kWarp);
        if (j0 + j < n) load_dims<kD, kVec>(keys + row * pool.key_width, dim, d, key[j]);
      }
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        if (j0 + j >= n) break;
        float dots[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          dots[g] = 0.0f;
#pragma unroll
          for (int i = 0; i < kD; ++i) dots[g] += qr[g][i] * key[j][i];
        }
        const float score = reduce_scatter<kG>(dots, lane);
        if (lane < kG) probs[warp][j0 + j][lane] = score * scale;
      }
    }
    __syncwarp();
    // The tile's softmax, one lane per position, folded into each head's running max and sums.
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float score = lane < n ? probs[warp][lane][g] : -INFINITY;
      const float new_max = fmaxf(run_max[g], warp_max(score));
      const float rescale = expf(run_max[g] - new_max);  // 0 for the first tile
      const float e = lane < n ? expf(score - new_max) : 0.0f;
      probs[warp][lane][g] = e;
      lane_sum[g] = lane_sum[g] * rescale + e;
#pragma unroll
      for (int i = 0; i < kD; ++i) acc[g][i] *= rescale;
      run_max[g] = new_max;
    }
    __syncwarp();
    // The weighted value rows.
    for (int j0 = 0; j0 < n; j0 += kRowsInFlight) {
      float value[kRowsInFlight][kD];
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        const int64_t row = __shfl_sync(0xffffffffu, my_row, (j0 + j) % kWarp);
        if (j0 + j < n) load_dims<kD, kVec>(values + row * pool.value_width, dim, d, value[j]);
      }
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        if (j0 + j >= n) break;
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float p = probs[warp][j0 + j][g];
#pragma unroll
          for (int i = 0; i < kD; ++i) acc[g][i] += p * value[j][i];
        }
      }
    }
    __syncwarp();  // the next tile overwrites probs
  }

  // The warps' partials, then the chunk's: max over the warps, sums and accumulators rescaled to it.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float sum = warp_sum(lane_sum[g]);
    if (lane == 0) {
      warp_max_of[warp][g] = run_max[g];
      warp_sum_of[warp][g] = sum;
    }
#pragma unroll
    for (int i = 0; i < kD; ++i) warp_acc[warp][g][dim + i] = acc[g][i];
  }
  __syncthreads();
  write_chunk_partials(warp_max_of, warp_sum_of, warp_acc, d, part_max + part, part_sum + part, chunks,
                       part_acc + part * d, chunks * d);
}

void check_step(const StepView& step, const KvPool& pool, const char* op) {
  R3_CHECK(step.tokens >= 0 && (step.tokens == 0 || (step.seqs && step.positions && step.block_tables)) &&
               step.table_stride > 0 && pool.keys && pool.values && pool.block_size > 0,
           op, " (cuda): incomplete step metadata or KV pool");
}

}  // namespace

void write_kv_paged(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                    int64_t value_stride, const StepView& step, const KvPool& pool) {
  check_step(step, pool, "write_kv");
  if (step.tokens == 0) return;
  with_pool_type(pool, [&](auto kv) {
    backend::cuda::launch_kernel(write_kv_rows<decltype(kv)>, static_cast<unsigned>(step.tokens), 128, 0,
                                 ctx.cuda_state().stream, keys, key_stride, values, value_stride, step, pool);
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

void paged_attention(backend::Context& ctx, const Tensor& q, const StepView& step, const KvPool& pool,
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
  // Query heads per block: the largest power of two up to kMaxGroup dividing the KV head's group.
  int64_t group = 1;
  while (group * 2 <= kMaxGroup && (heads / num_kv_heads) % (group * 2) == 0) group *= 2;
  // Chunks: enough for the longest window of the step (the step's largest position + 1), of a
  // length that depends only on the mode (batch invariant) or on the step's size.
  const int64_t longest = sliding_window > 0 ? std::min(step.max_context, sliding_window) : step.max_context;
  // bf16 rows of a head size the tensor-core kernel takes go to it (attention_chunks_mma.cuh).
  const bool rows_aligned = pool.key_width % 8 == 0 && pool.value_width % 8 == 0;
  const bool on_tensor_cores = pool.bf16 && rows_aligned && (d == 64 || d == 128);
  const int64_t min_len = on_tensor_cores ? kMmaTile * kMmaBlockWarps : kTile * kBlockWarps, max_len = 8 * min_len;
  const auto chunks_of = [&](int64_t len) { return std::max<int64_t>(1, (longest + len - 1) / len); };
  int64_t chunk_len = min_len;
  if (!ctx.batch_invariant()) {
    const int64_t enough_blocks = 2 * ctx.cuda_state().sm_count, blocks_per_chunk = step.tokens * (heads / group);
    while (chunk_len < max_len && chunk_len < longest && blocks_per_chunk * chunks_of(2 * chunk_len) >= enough_blocks) {
      chunk_len *= 2;
    }
  }
  const int64_t chunks = chunks_of(chunk_len);
  const int64_t parts = step.tokens * heads * chunks;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor part_max = ctx.scratch_for_output(DType::F32, {parts}), part_sum = ctx.scratch_for_output(DType::F32, {parts});
  Tensor part_acc = ctx.scratch_for_output(DType::F32, {parts, d});
  const auto blocks = static_cast<unsigned>(step.tokens * (heads / group) * chunks);
  const cudaStream_t stream = ctx.cuda_state().stream;
  const int64_t vector = pool.bf16 ? 8 : 4;  // elements a 128-bit load takes from a row
  const bool aligned = pool.key_width % vector == 0 && pool.value_width % vector == 0 && d % vector == 0;
  auto launch = [&](auto kernel) {
    backend::cuda::launch_kernel(kernel, blocks, kBlockWarps * kWarp, 0, stream, q.data<float>(), step, pool, heads,
                                 num_kv_heads, d, scale, sliding_window, chunks, chunk_len, part_max.data<float>(),
                                 part_sum.data<float>(), part_acc.data<float>());
  };
  // Dimensions per lane: 1, 2, 4 or 8 (head_dim up to 32, 64, 128, 256), vector loads when a
  // lane's share of a whole head is 4 or 8 aligned elements; per pool element type.
  auto by_dims = [&](auto kv, auto group_tag) {
    using KV = decltype(kv);
    constexpr int kG = decltype(group_tag)::value;
    if (d <= 32) launch(attention_chunks<KV, kG, 1, false>);
    else if (d <= 64) launch(attention_chunks<KV, kG, 2, false>);
    else if (d == 128 && aligned) launch(attention_chunks<KV, kG, 4, true>);
    else if (d <= 128) launch(attention_chunks<KV, kG, 4, false>);
    else if (d == 256 && aligned) launch(attention_chunks<KV, kG, 8, true>);
    else launch(attention_chunks<KV, kG, 8, false>);
  };
  // On tensor cores, up to kMaxClusterChunks chunks may merge inside the attention kernel, each
  // (token, group)'s chunks a cluster (attention_chunks_mma.cuh): the kernel choice cluster_merge
  // (backend/cuda/kernel_choices.h), by rule when the grid is one wave of one block an SM. Then the
  // merge kernel is a link of the step's chain that the cluster removes; past one wave the
  // clusters cost more than they save. Same bits.
  const backend::cuda::State& state = ctx.cuda_state();
  const bool cluster_merge =
      on_tensor_cores && chunks <= kMaxClusterChunks && state.choices.cluster_merge_taken(blocks, state.sm_count);
  auto on_mma = [&](auto group_tag) {
    constexpr int kG = decltype(group_tag)::value;
    auto launch_mma = [&](auto kernel, auto merged_kernel) {
      if (cluster_merge) {
        backend::cuda::launch_kernel_in_clusters(merged_kernel, blocks, kMmaBlockWarps * kWarp, 0, stream,
                                                 static_cast<unsigned>(chunks), q.data<float>(), step, pool, heads,
                                                 num_kv_heads, scale, sliding_window, chunks, chunk_len, nullptr,
                                                 nullptr, nullptr, sinks, out.data<float>());
      } else {
        backend::cuda::launch_kernel(kernel, blocks, kMmaBlockWarps * kWarp, 0, stream, q.data<float>(), step, pool,
                                     heads, num_kv_heads, scale, sliding_window, chunks, chunk_len,
                                     part_max.data<float>(), part_sum.data<float>(), part_acc.data<float>(), nullptr,
                                     nullptr);
      }
    };
    if (d == 64) launch_mma(attention_chunks_mma<kG, 64>, attention_chunks_mma<kG, 64, true>);
    else launch_mma(attention_chunks_mma<kG, 128>, attention_chunks_mma<kG, 128, true>);
  };
  if (on_tensor_cores) {
    switch (group) {
      case 1: on_mma(std::integral_constant<int, 1>{}); break;
      case 2: on_mma(std::integral_constant<int, 2>{}); break;
      case 4: on_mma(std::integral_constant<int, 4>{}); break;
      default: on_mma(std::integral_constant<int, 8>{}); break;
    }
  } else with_pool_type(pool, [&](auto kv) {
    switch (group) {
      case 1: by_dims(kv, std::integral_constant<int, 1>{}); break;
      case 2: by_dims(kv, std::integral_constant<int, 2>{}); break;
      case 4: by_dims(kv, std::integral_constant<int, 4>{}); break;
      default: by_dims(kv, std::integral_constant<int, 8>{}); break;
    }
  });
  if (cluster_merge) {
    R3_CUDA_CHECK(cudaGetLastError());
    return;
  }
  backend::cuda::launch_kernel(merge_chunks, static_cast<unsigned>(step.tokens * heads), merge_threads(d), 0, stream,
                               part_max.data<float>(), part_sum.data<float>(), part_acc.data<float>(), heads, d, chunks,
                               sinks, step.seqs, out.data<float>(), /*release=*/true);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
