// Rotary embedding on the GPU, the CPU's arithmetic: angle = float(position) * inv_freq[i] in
// float32, its cosine and sine in double rounded to float, times attention_scaling, then the pair
// update with each product rounded (no fused multiply-add). Two layouts: "rotate half" (pairs
// (i, i + half) of the leading rotary dims, ops/rotary.h) and DeepSeek's trailing interleaved one
// (pairs (2i, 2i + 1) of the trailing rope dims, ops/interleaved_rotary.h). One block per token,
// positions from the step's device metadata. prepare_attention_rows does a GQA layer's work
// between its projection and its attention in one kernel: q/k norms, rotation, and the writes of
// the keys and values to the paged pool.
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

// The attention rows of the step: one block per (token, group of kHeadsPerBlock heads), one warp
// per head. Each query and key head is read from its projection (rows of any stride, so q, k and
// v may be parts of one fused projection's output), RMS-normalised over the head when the layer
// has q/k norms (the mean of squares in double, as rms_norm computes it), rotated at the token's
// position (the cosines and sines computed once per block), then the query head is written to
// q_out and the key head to the paged pool; the first block of a token copies its value row to
// the pool. The head passes through the warp's shared row, so the rotation's pairs may sit in
// different lanes and q_out may be the query input itself.
constexpr int kHeadsPerBlock = 8;
// Values of its head a lane loads before the cosines and sines (heads of up to 256 entirely).
constexpr int kHeldPerLane = 8;

// A warp's head row rotated with the block's cosines and sines into `out` (float32, or the pool's
// element type): rounded products, then the sum, no fused multiply-add, as on the CPU.
template <typename T>
__device__ inline void write_rotated(const float* row, const float* cosines, const float* sines, int64_t half,
                                     int64_t head_dim, int lane, T* out) {
  for (int64_t i = lane; i < half; i += kWarp) {
    const float c = cosines[i], s = sines[i], a = row[i], b = row[i + half];
    store(out, i, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    store(out, i + half, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
  for (int64_t i = 2 * half + lane; i < head_dim; i += kWarp) store(out, i, row[i]);  // past a partial rotary
}

template <typename KV>
__global__ void prepare_rows(AttentionRows rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t half,
                             float eps, StepView step, KvPool pool, Frequencies freq, float scaling,
                             float* q_out) {  // q_out may be rows.q
  extern __shared__ float shared[];  // [kHeadsPerBlock][head_dim] rows, then [half] cosines, [half] sines
  const int64_t blocks_per_token = (heads + kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int64_t t = blockIdx.x / blocks_per_token, first_head = (blockIdx.x % blocks_per_token) * kHeadsPerBlock;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  float* row = shared + warp * head_dim;
  float* cosines = shared + kHeadsPerBlock * head_dim;
  float* sines = cosines + half;
  // Before the wait (backend/cuda/launch.cuh), what comes from the step's metadata alone: the
  // position, the key's place in the pool (the block table) and the cosines and sines, so that
  // where the projection before releases this kernel early they are ready when its rows are.
  const int64_t position_index = step.positions[t];
  const float position = static_cast<float>(position_index);
  const int32_t seq = step.seqs[t];
  const int64_t cache = seq >= 0 ? cache_row(step, pool, seq, position_index) : -1;  // padding: no write
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) angle(position, freq, i, scaling, &cosines[i], &sines[i]);
  const int64_t h = first_head + warp;
  const bool has_head = h < heads + kv_heads, is_q = h < heads;
  const int64_t head = is_q ? h : h - heads;
  // The head's norm weights too (no kernel writes them): after the wait they would be a trip to
  // memory after the reduction.
  const float* norm = is_q ? rows.q_norm : rows.k_norm;
  float held_norm[kHeldPerLane];
#pragma unroll
  for (int j = 0; j < kHeldPerLane; ++j) {
    const int64_t i = lane + static_cast<int64_t>(j) * kWarp;
    held_norm[j] = has_head && norm != nullptr && i < head_dim ? norm[i] : 0.0f;
  }
  backend::cuda::wait_for_predecessor();
  backend::cuda::release_successor();  // attention loads past keys and values meanwhile
  // The warp's head (in registers, kHeldPerLane values a lane).
  const float* in = !has_head ? nullptr
                    : is_q    ? rows.q + t * rows.q_stride + head * head_dim
                              : rows.k + t * rows.k_stride + head * head_dim;
  float held[kHeldPerLane];
#pragma unroll
  for (int j = 0; j < kHeldPerLane; ++j) {
    const int64_t i = lane + static_cast<int64_t>(j) * kWarp;
    held[j] = has_head && i < head_dim ? in[i] : 0.0f;
  }
  __syncthreads();
  if (has_head) {
    double sum = 0;  // in element order, the held values first
#pragma unroll
    for (int j = 0; j < kHeldPerLane; ++j) {
      const int64_t i = lane + static_cast<int64_t>(j) * kWarp;
      if (i < head_dim) {
        row[i] = held[j];
        sum += static_cast<double>(held[j]) * held[j];
      }
    }
    for (int64_t i = lane + static_cast<int64_t>(kHeldPerLane) * kWarp; i < head_dim; i += kWarp) {
      const float v = in[i];
      row[i] = v;
      sum += static_cast<double>(v) * v;
    }
    if (norm != nullptr) {
      for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      const auto inv = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(head_dim) + eps));
#pragma unroll
      for (int j = 0; j < kHeldPerLane; ++j) {
        const int64_t i = lane + static_cast<int64_t>(j) * kWarp;
        if (i < head_dim) row[i] = held_norm[j] * (row[i] * inv);
      }
      for (int64_t i = lane + static_cast<int64_t>(kHeldPerLane) * kWarp; i < head_dim; i += kWarp) {
        row[i] = norm[i] * (row[i] * inv);
      }
    }
    __syncwarp();
    // Where the head goes: q_out, or the key's place in the pool (none for a padding token).
    if (is_q) {
      write_rotated(row, cosines, sines, half, head_dim, lane, q_out + (t * heads + head) * head_dim);
    } else if (cache >= 0) {
      write_rotated(row, cosines, sines, half, head_dim, lane,
                    pool_keys<KV>(pool) + cache * pool.key_width + head * head_dim);
    }
  }
  if (cache < 0 || first_head != 0) return;
  const int64_t width = kv_heads * head_dim;
  KV* values = pool_values<KV>(pool) + cache * pool.value_width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) store(values, i, rows.v[t * rows.v_stride + i]);
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

void interleaved_rotary(backend::Context& ctx, const TrailingInterleavedRotary& rotary, Tensor& x,
                        const int32_t* positions) {
  rotate<true>(ctx, rotary.rope_dim(), rotary.inv_freq(), rotary.attention_scaling(), x, positions);
}

void prepare_attention_rows(backend::Context& ctx, const Rotary& rotary, const AttentionRows& rows, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, float eps, const StepView& step,
                            const KvPool& pool, Tensor& q_out) {
  const int64_t half = rotary.rotary_dim() / 2, width = kv_heads * head_dim;
  R3_CHECK(q_out.is_contiguous() && q_out.device() == Device::kCuda &&
               q_out.numel() == step.tokens * heads * head_dim && rows.q && rows.k && rows.v &&
               rows.q_stride >= heads * head_dim && rows.k_stride >= width && rows.v_stride >= width &&
               (rows.q_norm == nullptr) == (rows.k_norm == nullptr),
           "prepare_attention_rows (cuda): q_out ", shape_to_string(q_out.shape()), " for ", step.tokens, " tokens of ",
           heads, " + ", kv_heads, " heads of ", head_dim, ", row strides ", rows.q_stride, ", ", rows.k_stride, ", ",
           rows.v_stride);
  R3_CHECK(head_dim >= rotary.rotary_dim() && half <= kMaxHalf && pool.key_width >= width &&
               pool.value_width >= width && pool.keys && pool.values && pool.block_size > 0 &&
               (step.tokens == 0 || (step.seqs && step.positions && step.block_tables)),
           "prepare_attention_rows (cuda): head_dim ", head_dim, ", rotary dim ", rotary.rotary_dim(), ", pool rows of ",
           pool.key_width, " + ", pool.value_width, " floats for ", width);
  if (step.tokens == 0) return;
  const int64_t blocks_per_token = (heads + kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const std::size_t shared_bytes = (kHeadsPerBlock * head_dim + 2 * half) * sizeof(float);
  with_pool_type(pool, [&](auto kv) {
    backend::cuda::launch_kernel(prepare_rows<decltype(kv)>, static_cast<unsigned>(step.tokens * blocks_per_token),
                                 kHeadsPerBlock * kWarp, shared_bytes, ctx.cuda_state().stream, rows, heads, kv_heads,
                                 head_dim, half, eps, step, pool, frequencies(rotary.inv_freq(), half),
                                 rotary.attention_scaling(), q_out.data<float>());
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
