// Rotary embedding on the GPU, the CPU's arithmetic: angle = float(position) * inv_freq[i] in
// float32, its cosine and sine in double rounded to float, times attention_scaling, then the pair
// update with each product rounded (no fused multiply-add). Two layouts: "rotate half" (pairs
// (i, i + half) of the leading rotary dims, ops/rotary.h) and DeepSeek's trailing interleaved one
// (pairs (2i, 2i + 1) of the trailing rope dims, ops/interleaved_rotary.h). One block per token,
// positions from the step's device metadata.
#include "backend/cuda/state.h"
#include "ops/interleaved_rotary.h"
#include "ops/rotary.h"

namespace r3::ops::cuda {

namespace {

constexpr int kMaxHalf = 256;  // rotary_dim up to 512

struct Frequencies {
  float inv_freq[kMaxHalf];
};

template <bool kInterleavedTail>
__global__ void rotate_heads(float* __restrict__ x, int64_t heads, int64_t head_dim, int64_t half,
                             const int32_t* __restrict__ positions, Frequencies freq, float scaling) {
  const int64_t t = blockIdx.x;
  const float position = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = position * freq.inv_freq[i];
    const float c = __fmul_rn(static_cast<float>(cos(static_cast<double>(angle))), scaling);
    const float s = __fmul_rn(static_cast<float>(sin(static_cast<double>(angle))), scaling);
    // The pair's two elements.
    const int64_t first = kInterleavedTail ? head_dim - 2 * half + 2 * i : i;
    const int64_t second = kInterleavedTail ? first + 1 : i + half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      const float a = v[first], b = v[second];
      // Rounded products, then the sum: no fused multiply-add, as on the CPU.
      v[first] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      v[second] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
  }
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
  Frequencies freq{};
  for (int64_t i = 0; i < half; ++i) freq.inv_freq[i] = inv_freq[static_cast<std::size_t>(i)];
  rotate_heads<kInterleavedTail><<<static_cast<unsigned>(tokens), 64, 0, ctx.cuda_state().stream>>>(
      x.data<float>(), heads, head_dim, half, positions, freq, scaling);
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

}  // namespace r3::ops::cuda
