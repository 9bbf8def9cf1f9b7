// Grouped-query attention chunks on bfloat16 tensor cores, for bf16 KV pools (a bf16 model's):
// the same blocks and partials as attention_chunks in sm90_paged_attention.cu (one block per
// token, group of query heads sharing a KV head and chunk; the chunk's max, sum and accumulator
// per head, merged by merge_chunks), with the arithmetic on mma.sync m16n8k16 instead of
// per-lane dot products and shuffles. The CUDA-core kernel keeps 8 heads' queries and
// accumulators per lane (220 registers: 8 warps per SM, four rows in flight each, too few loads
// to approach memory bandwidth); here a warp holds them in MMA fragments (166 registers at head
// dim 128: 12 warps per SM) and every load of its 16-position tile is in flight at once.
//
// Per warp and tile of 16 positions, with the operands swapped as in mma_rows.cuh (the 16-row
// side is what memory brings, the 8-column side the group's heads, so nothing is padded for a
// group of 8):
//   scores S^T [16 positions x 8 heads] = K [16 x d] . Q^T [d x 8], K slots permuted so that each
//     lane reads 8 consecutive dimensions of its key rows (g and g + 8) with one 128-bit load;
//   O^T [d x 8 heads] += V^T [d x 16 positions] . P^T [16 x 8], each lane reading d / 8
//     consecutive dimensions of 4 value rows (2t, 2t + 1, 2t + 8, 2t + 9) and pairing them up
//     with byte permutes; the probabilities move from the score fragment to the operand fragment
//     with movmatrix (an 8x8 transpose in registers).
// Queries and probabilities are float32 split into high and low bfloat16 parts (x = hi + lo to
// about 16 significant bits, as ops/cuda/split_bf16.h does for activations): both multiply the
// same keys or values, so the result keeps float32 accuracy over the stored bf16 rows. The online
// softmax runs in the score fragment: a lane holds 2 positions of 2 heads, and a head's maximum
// meets across the 8 lanes sharing it (3 shuffles).
//
// Internal to ops/cuda (included by sm90_paged_attention.cu, which dispatches to it).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/mma_rows.cuh"
#include "ops/cuda/paged_attention_parts.cuh"
#include "ops/cuda/warp_row_dots.cuh"

namespace r3::ops::cuda {
namespace {

constexpr int kMmaTile = 16;      // positions per warp tile: the MMA's M
constexpr int kMmaHeads = 8;      // query heads per block: the MMA's N
constexpr int kMmaBlockWarps = 4;

// (x's low half, y's low half) and (x's high half, y's high half) as one bf16 pair.
__device__ inline uint32_t low_halves(uint32_t x, uint32_t y) { return __byte_perm(x, y, 0x5410); }
__device__ inline uint32_t high_halves(uint32_t x, uint32_t y) { return __byte_perm(x, y, 0x7632); }

// Lane (r = lane / 4, t = lane % 4) holds elements (r, 2t), (r, 2t + 1) of an 8x8 bf16 matrix;
// it gets those of the transpose.
__device__ inline uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// (a, b) split into bf16 pairs: hi = (bf16(a), bf16(b)), lo = the remainders, a in the low half.
__device__ inline void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 back = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - back.x, b - back.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

__device__ inline uint32_t word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Chunks a cluster merges at most (a cluster of 16 blocks is non-portable: allowed on Hopper).
constexpr int64_t kMaxClusterChunks = 16;

// The cluster's end of attention_chunks_mma<kG, kD, true>: this block's chunk partials (from its
// warps' partials, or none when the chunk has no positions: warp_* null) into its shared memory
// with write_chunk_partials, then, once every block of the cluster has its own, the output rows of
// the kG heads merged from all chunks' partials read through distributed shared memory: the
// cluster's threads take the kG * kD elements in turn, each merging in chunk order as
// merge_chunks does (sinks join the sum; a padding row, seq < 0, gets zeros). Every block of the
// cluster calls it (cluster barriers); a block's shared memory stays until the last reader is done.
template <int kG, int kD, int kWarps = kMmaBlockWarps>
__device__ inline void merge_in_cluster(const float (*warp_max_of)[kWarps][kG], const float (*warp_sum_of)[kWarps][kG],
                                        const float (*warp_acc)[kWarps][kG][kD], int64_t heads, int64_t chunks,
                                        int64_t t, int64_t first_head, int32_t seq, const float* __restrict__ sinks,
                                        float* __restrict__ out) {
  namespace cg = cooperative_groups;
  __shared__ float chunk_max[kG], chunk_sum[kG], chunk_acc[kG * kD];
  if (warp_max_of != nullptr) {
    write_chunk_partials(*warp_max_of, *warp_sum_of, *warp_acc, kD, chunk_max, chunk_sum, 1, chunk_acc, kD);
  } else if (threadIdx.x < kG) {
    chunk_max[threadIdx.x] = -INFINITY;
    chunk_sum[threadIdx.x] = 0.0f;  // 0: skipped in the merge, as merge_chunks skips an empty chunk
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int64_t threads = chunks * blockDim.x;
  for (int64_t i = cluster.block_rank() * blockDim.x + threadIdx.x; i < kG * kD; i += threads) {
    const int g = static_cast<int>(i / kD), e = static_cast<int>(i % kD);
    const int64_t head = first_head + g;
    float* o = out + (t * heads + head) * kD + e;
    if (seq < 0) {  // a padding row attends to nothing
      *o = 0.0f;
      continue;
    }
    float mc[kMaxClusterChunks], sc[kMaxClusterChunks], ac[kMaxClusterChunks];
#pragma unroll
    for (int c = 0; c < kMaxClusterChunks; ++c) {
      const bool in = c < chunks;
      mc[c] = in ? *cluster.map_shared_rank(chunk_max + g, c) : -INFINITY;
      sc[c] = in ? *cluster.map_shared_rank(chunk_sum + g, c) : 0.0f;
      ac[c] = in && sc[c] != 0.0f ? *cluster.map_shared_rank(chunk_acc + g * kD + e, c) : 0.0f;
    }
    *o = merge_element(mc, sc, ac, sinks ? sinks + head : nullptr);
  }
  cluster.sync();
}

// kG query heads (1, 2, 4 or 8; the rest of the MMA's 8 columns are zeros) of head dim kD (64 or
// 128: three blocks per SM in registers, 166 at 128; 256 would spill) over a bf16 pool whose rows
// are 16-byte aligned.
//
// kClusterMerge: the chunks of a (token, group of heads) run as one thread-block cluster (chunks
// <= kMaxClusterChunks, the launch's cluster size), whose blocks keep their chunk's partials in
// shared memory and merge them into the output rows through distributed shared memory, with
// merge_chunks' arithmetic in its order (the same bits): no merge kernel, no trip through global
// memory between the two. part_* are then unused; the kernel releases the o projection after its
// wait, so that o loads its first weights while this kernel runs, as after merge_chunks.
template <int kG, int kD, bool kClusterMerge = false>
__global__ void __launch_bounds__(kMmaBlockWarps * kWarp, 3)
    attention_chunks_mma(const float* __restrict__ q, StepView step, KvPool pool, int64_t heads,
                         int64_t kv_heads, float scale, int64_t sliding_window, int64_t chunks, int64_t chunk_len,
                         float* __restrict__ part_max, float* __restrict__ part_sum, float* __restrict__ part_acc,
                         const float* __restrict__ sinks = nullptr, float* __restrict__ out = nullptr) {
  static_assert(kG >= 1 && kG <= kMmaHeads && (kD == 64 || kD == 128), "shape");
  constexpr int kSteps = kD / 16;       // MMAs of K = 16 along the head (scores) = m-tiles of O^T
  constexpr int kKeyLoads = kD / 32;    // 128-bit loads of a key row per lane
  constexpr int kValueLoads = kD / 64;  // 128-bit loads of a value row per lane (d / 8 dimensions)
  __shared__ float warp_max_of[kMmaBlockWarps][kG], warp_sum_of[kMmaBlockWarps][kG];
  __shared__ float warp_acc[kMmaBlockWarps][kG][kD];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int r = lane / 4, c = lane % 4;
  const int64_t groups_per_token = heads / kG;
  const int64_t chunk = blockIdx.x % chunks, tg = blockIdx.x / chunks;
  const int64_t t = tg / groups_per_token, first_head = (tg % groups_per_token) * kG;
  const int64_t kv_offset = (first_head / (heads / kv_heads)) * kD;
  // The step's metadata comes from a copy before the step's first kernel: readable before the wait.
  const int32_t seq = step.seqs[t];
  int64_t first = 0, count = 0, fresh = 0;
  if (seq >= 0) {
    const int64_t pos = step.positions[t];
    const int64_t begin = sliding_window > 0 ? max(int64_t{0}, pos - sliding_window + 1) : 0;
    first = begin + chunk * chunk_len;
    count = max(int64_t{0}, min(pos + 1, first + chunk_len) - first);
    // Positions from here on may be rows this step writes (its tokens of this sequence are at
    // most step.tokens consecutive positions ending at or after pos); those before were written
    // by earlier steps.
    fresh = pos - (step.tokens - 1) - first;
  }
  const auto* keys = static_cast<const __nv_bfloat16*>(pool.keys) + kv_offset;
  const auto* value_heads = static_cast<const __nv_bfloat16*>(pool.values) + kv_offset;
  const __nv_bfloat16* values = value_heads + (kD / 8) * r;
  // A tile's loads: key rows r and r + 8, value rows 2c, 2c + 1, 2c + 8, 2c + 9 (zeros past the
  // tile's positions). The warp's first tile is loaded before the queries, so that its trips
  // through the block table and to memory overlap theirs; each later one at the end of the tile
  // before it.
  uint4 key_top[kKeyLoads], key_bottom[kKeyLoads], value[4][kValueLoads];
  auto load_tile = [&](int64_t tile_first) {
    const int n = static_cast<int>(min(int64_t{kMmaTile}, count - tile_first));
    const int key_rows[2] = {r, r + 8}, value_rows[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint4* dst = i == 0 ? key_top : key_bottom;
      const bool valid = key_rows[i] < n;
      const __nv_bfloat16* row =
          valid ? keys + cache_row(step, pool, seq, first + tile_first + key_rows[i]) * pool.key_width + 8 * c : nullptr;
#pragma unroll
      for (int j = 0; j < kKeyLoads; ++j) dst[j] = valid ? load_streaming(row + 32 * j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool valid = value_rows[i] < n;
      const __nv_bfloat16* row =
          valid ? values + cache_row(step, pool, seq, first + tile_first + value_rows[i]) * pool.value_width : nullptr;
#pragma unroll
      for (int j = 0; j < kValueLoads; ++j) value[i][j] = valid ? load_streaming(row + 8 * j) : make_uint4(0, 0, 0, 0);
    }
  };
  constexpr int64_t kTileStride = kMmaBlockWarps * kMmaTile;
  const int64_t first_tile = static_cast<int64_t>(warp) * kMmaTile;
  // A first tile of past rows only is loaded before the wait (backend/cuda/launch.cuh), so that
  // its trips through the block table and to memory overlap the kernel before, which releases
  // this one early.
  const bool tile_before_wait = first_tile < count && first_tile + kMmaTile <= fresh;
  if (tile_before_wait) load_tile(first_tile);
  backend::cuda::wait_for_predecessor();
  if constexpr (kClusterMerge) backend::cuda::release_successor();
  const int64_t part = (t * heads + first_head) * chunks + chunk;
  if (count == 0) {
    if constexpr (kClusterMerge) {
      merge_in_cluster<kG, kD, kMmaBlockWarps>(nullptr, nullptr, nullptr, heads, chunks, t, first_head, seq, sinks, out);
    } else {
      for (int g = static_cast<int>(threadIdx.x); g < kG; g += static_cast<int>(blockDim.x)) {
        part_max[part + g * chunks] = -INFINITY;
        part_sum[part + g * chunks] = 0.0f;
      }
    }
    return;
  }
  if (!tile_before_wait && first_tile < count) load_tile(first_tile);
  // Q^T fragments: lane holds head r's dimensions 32j + 8c + 4s + {0, 1} (b0) and + {2, 3} (b1)
  // for the MMA 2j + s, split into hi and lo.
  uint32_t q_hi[kSteps][2], q_lo[kSteps][2];
#pragma unroll
  for (int j = 0; j < kKeyLoads; ++j) {
    float v[8];
    if (r < kG) {
      load8(q + (t * heads + first_head + r) * kD + 32 * j + 8 * c, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      split_pair(v[4 * s], v[4 * s + 1], q_hi[2 * j + s][0], q_lo[2 * j + s][0]);
      split_pair(v[4 * s + 2], v[4 * s + 3], q_hi[2 * j + s][1], q_lo[2 * j + s][1]);
    }
  }
  // O^T accumulators: m-tile m holds dimensions (d / 8) r + 2m (elements 0, 1) and + 1 (2, 3) of
  // heads 2c (elements 0, 2) and 2c + 1 (1, 3).
  float acc[kSteps][4];
#pragma unroll
  for (int m = 0; m < kSteps; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, lane_sum[2] = {0.0f, 0.0f};

  for (int64_t tile_first = static_cast<int64_t>(warp) * kMmaTile; tile_first < count; tile_first += kTileStride) {
    const int n = static_cast<int>(min(int64_t{kMmaTile}, count - tile_first));
    // The warp's next tile into L2 while this one is computed (lanes 0-15 its key rows, 16-31
    // its value rows), so that its loads wait on L2 rather than memory.
    const int64_t next = tile_first + kTileStride + lane % 16;
    if (next < count) {
      const int64_t row = cache_row(step, pool, seq, first + next);
      if (lane < 16) prefetch_l2(keys + row * pool.key_width, kD);
      else prefetch_l2(value_heads + row * pool.value_width, kD);
    }
    // Scores: element 0 = (position r, head 2c), 1 = (r, 2c + 1), 2 = (r + 8, 2c), 3 = (r + 8, 2c + 1).
    float score[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kKeyLoads; ++j) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint32_t a0 = word(key_top[j], 2 * s), a1 = word(key_bottom[j], 2 * s);
        const uint32_t a2 = word(key_top[j], 2 * s + 1), a3 = word(key_bottom[j], 2 * s + 1);
        mma_rows::mma(score, a0, a1, a2, a3, q_hi[2 * j + s][0], q_hi[2 * j + s][1]);
        mma_rows::mma(score, a0, a1, a2, a3, q_lo[2 * j + s][0], q_lo[2 * j + s][1]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) score[i] = (i < 2 ? r : r + 8) < n ? score[i] * scale : -INFINITY;
    // The tile's softmax per head (2c, 2c + 1), folded into the running max and sums.
    float p[4], rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = fmaxf(score[h], score[h + 2]);
#pragma unroll
      for (int offset = 4; offset < kWarp; offset *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
      const float new_max = fmaxf(run_max[h], m);
      rescale[h] = expf(run_max[h] - new_max);  // 0 for the first tile
      p[h] = expf(score[h] - new_max);          // 0 for a position past the tile
      p[h + 2] = expf(score[h + 2] - new_max);
      lane_sum[h] = lane_sum[h] * rescale[h] + p[h] + p[h + 2];
      run_max[h] = new_max;
    }
    // P^T fragments: positions 2c, 2c + 1 (b0) and 2c + 8, 2c + 9 (b1) of head r.
    uint32_t top_hi, top_lo, bottom_hi, bottom_lo;
    split_pair(p[0], p[1], top_hi, top_lo);
    split_pair(p[2], p[3], bottom_hi, bottom_lo);
    const uint32_t b0_hi = transpose8x8(top_hi), b0_lo = transpose8x8(top_lo);
    const uint32_t b1_hi = transpose8x8(bottom_hi), b1_lo = transpose8x8(bottom_lo);
#pragma unroll
    for (int m = 0; m < kSteps; ++m) {
      // Word m of a lane's d / 8 dimensions: dimensions 2m (low half) and 2m + 1 (high half).
      const uint32_t w0 = word(value[0][m / 4], m % 4), w1 = word(value[1][m / 4], m % 4);
      const uint32_t w2 = word(value[2][m / 4], m % 4), w3 = word(value[3][m / 4], m % 4);
      const uint32_t a0 = low_halves(w0, w1), a1 = high_halves(w0, w1);
      const uint32_t a2 = low_halves(w2, w3), a3 = high_halves(w2, w3);
      acc[m][0] *= rescale[0];
      acc[m][1] *= rescale[1];
      acc[m][2] *= rescale[0];
      acc[m][3] *= rescale[1];
      mma_rows::mma(acc[m], a0, a1, a2, a3, b0_hi, b1_hi);
      mma_rows::mma(acc[m], a0, a1, a2, a3, b0_lo, b1_lo);
    }
    if (tile_first + kTileStride < count) load_tile(tile_first + kTileStride);
  }

  // The warp's partials per head, then the chunk's.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = lane_sum[h];
#pragma unroll
    for (int offset = 4; offset < kWarp; offset *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int head = 2 * c + h;
    if (head < kG) {
      if (r == 0) {
        warp_max_of[warp][head] = run_max[h];
        warp_sum_of[warp][head] = sum;
      }
#pragma unroll
      for (int m = 0; m < kSteps; ++m) {
        warp_acc[warp][head][(kD / 8) * r + 2 * m] = acc[m][h];
        warp_acc[warp][head][(kD / 8) * r + 2 * m + 1] = acc[m][h + 2];
      }
    }
  }
  __syncthreads();
  if constexpr (kClusterMerge) {
    merge_in_cluster<kG, kD, kMmaBlockWarps>(&warp_max_of, &warp_sum_of, &warp_acc, heads, chunks, t, first_head, seq, sinks, out);
  } else {
    write_chunk_partials(warp_max_of, warp_sum_of, warp_acc, kD, part_max + part, part_sum + part, chunks,
                         part_acc + part * kD, chunks * kD);
  }
}

}  // namespace
}  // namespace r3::ops::cuda
