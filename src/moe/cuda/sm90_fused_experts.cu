// The fused experts kernels (moe/device_experts.h). A warp computes one dot product: its lanes
// take every 32nd element and the partial sums meet through shuffles. Three launches on the
// context's stream: gate/up + activation per (pair, intermediate row), down per (pair, hidden
// row), then the combine per (token, hidden element), summing the k choices in order as the CPU
// does (each product rounded, then added).
#include <cuda_bf16.h>

#include "backend/cuda/state.h"
#include "moe/device_experts.h"

namespace r3::moe {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

template <typename W>
__device__ inline float warp_dot(const float* x, const W* w, int64_t n, int lane) {
  float partial = 0.0f;
  for (int64_t i = lane; i < n; i += kWarp) partial += x[i] * load(w, i);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) partial += __shfl_xor_sync(0xffffffffu, partial, offset);
  return partial;
}

struct Activation {
  ExpertActivation::Kind kind;
  float limit, alpha;
  __device__ float operator()(float gate, float up) const {
    const float g = gate > limit ? limit : gate;
    const float u = up > limit ? limit : (up < -limit ? -limit : up);
    if (kind == ExpertActivation::Kind::kSwiglu) return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(g, alpha))));
    return __fmul_rn(__fadd_rn(u, 1.0f), __fmul_rn(g, sig));
  }
};

template <typename W>
__global__ void gate_up_rows(const float* __restrict__ hidden, const int32_t* __restrict__ ids, int64_t k, int64_t pairs,
                             const W* __restrict__ gate, const W* __restrict__ up, const float* __restrict__ gate_bias,
                             const float* __restrict__ up_bias, int64_t h, int64_t inter, Activation act,
                             float* __restrict__ activated) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= pairs * inter) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t p = warp / inter, i = warp % inter, e = ids[p];
  const float* x = hidden + (p / k) * h;
  const int64_t row = e * inter + i;
  float g = warp_dot(x, gate + row * h, h, lane), u = warp_dot(x, up + row * h, h, lane);
  if (lane == 0) {
    if (gate_bias) g += gate_bias[row];
    if (up_bias) u += up_bias[row];
    activated[p * inter + i] = act(g, u);
  }
}

template <typename W>
__global__ void down_rows(const float* __restrict__ activated, const int32_t* __restrict__ ids, int64_t pairs,
                          const W* __restrict__ down, const float* __restrict__ down_bias, int64_t h, int64_t inter,
                          float* __restrict__ expert_out) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (warp >= pairs * h) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t p = warp / h, d = warp % h, e = ids[p];
  float y = warp_dot(activated + p * inter, down + (e * h + d) * inter, inter, lane);
  if (lane == 0) expert_out[p * h + d] = down_bias ? y + down_bias[e * h + d] : y;
}

__global__ void combine_choices(const float* __restrict__ expert_out, const float* __restrict__ weights, int64_t tokens,
                                int64_t k, int64_t h, float* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * h) return;
  const int64_t t = i / h, d = i % h;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum = __fadd_rn(sum, __fmul_rn(weights[t * k + j], expert_out[(t * k + j) * h + d]));
  out[i] = sum;
}

unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename W>
void launch(backend::Context& ctx, const Tensor& hidden, const int32_t* ids, const float* weights, int64_t k,
            const DeviceExperts& x, Tensor& activated, Tensor& expert_out, Tensor& out) {
  const cudaStream_t stream = ctx.cuda_state().stream;
  const int64_t tokens = hidden.dim(0), h = hidden.dim(1), inter = x.gate.dim(1), pairs = tokens * k;
  auto bias = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  const Activation act{x.activation.kind, x.activation.limit, x.activation.alpha};
  gate_up_rows<<<warp_blocks(pairs * inter), kWarpsPerBlock * kWarp, 0, stream>>>(
      hidden.data<float>(), ids, k, pairs, static_cast<const W*>(x.gate.raw_data()), static_cast<const W*>(x.up.raw_data()),
      bias(x.gate_bias), bias(x.up_bias), h, inter, act, activated.data<float>());
  down_rows<<<warp_blocks(pairs * h), kWarpsPerBlock * kWarp, 0, stream>>>(
      activated.data<float>(), ids, pairs, static_cast<const W*>(x.down.raw_data()), bias(x.down_bias), h, inter,
      expert_out.data<float>());
  combine_choices<<<static_cast<unsigned>((tokens * h + 255) / 256), 256, 0, stream>>>(expert_out.data<float>(), weights,
                                                                                         tokens, k, h, out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fused_experts_on_device(backend::Context& ctx, const Tensor& hidden, const int32_t* ids, const float* weights,
                             int64_t k, const DeviceExperts& experts, Tensor& activated, Tensor& expert_out,
                             Tensor& out) {
  const Tensor& g = experts.gate;
  R3_CHECK(hidden.rank() == 2 && g.rank() == 3 && experts.up.shape() == g.shape() && experts.down.rank() == 3 &&
               experts.down.dim(0) == g.dim(0) && experts.down.dim(1) == g.dim(2) &&
               experts.down.dim(2) == g.dim(1) && hidden.dim(1) == g.dim(2) && out.shape() == hidden.shape() &&
               g.dtype() == experts.up.dtype() && g.dtype() == experts.down.dtype(),
           "experts (cuda): hidden ", shape_to_string(hidden.shape()), ", gate ", shape_to_string(g.shape()), ", down ",
           shape_to_string(experts.down.shape()));
  const int64_t tokens = hidden.dim(0), pairs = tokens * k;
  R3_CHECK(activated.numel() >= pairs * g.dim(1) && expert_out.numel() >= pairs * hidden.dim(1),
           "experts (cuda): scratch too small for ", pairs, " pairs");
  if (tokens == 0) return;
  switch (g.dtype()) {
    case DType::F32: return launch<float>(ctx, hidden, ids, weights, k, experts, activated, expert_out, out);
    case DType::BF16: return launch<__nv_bfloat16>(ctx, hidden, ids, weights, k, experts, activated, expert_out, out);
    default: R3_FAIL("experts (cuda): weights of dtype ", dtype_name(g.dtype()), " (expected F32 or BF16)");
  }
}

}  // namespace r3::moe
