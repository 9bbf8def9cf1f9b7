// The KDA layer's core on the GPU (ops/delta_rule.h): one block per (row, head), of which the
// blocks whose row begins a run do the work; each walks its run's rows in order with the head's
// state [dim, dim] in shared memory. Thread j owns the state's column j (and key channel j for
// the per-token vectors): the decay, the prediction k^T S, the delta update and the output q^T S
// of a column touch only that column, so the token's only block-wide steps are the three norms
// (q's and k's L2 norms, the output's RMS). The arithmetic is the CPU's in float32 (the CPU
// rounds the state to float32 after each token too).
#include <mutex>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/block_sum.cuh"
#include "ops/cuda/sequence_runs.cuh"
#include "ops/delta_rule.h"

namespace r3::ops::cuda {

namespace {

constexpr int kWarp = 32;
constexpr float kL2Eps = 1e-6f;  // transformers' l2norm

__global__ void gated_delta_rule_runs(int64_t heads, int64_t dim, DeltaRuleStepRows rows, DeltaRuleHeadWeights w,
                                      StepView step, float* __restrict__ state, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t r = blockIdx.x, h = blockIdx.y, width = heads * dim;
  const int j = static_cast<int>(threadIdx.x);
  const bool owner = j < dim;  // threads past dim (rounding up to a warp) only join the sums
  if (step.seqs[r] < 0) {
    if (owner) out[r * width + h * dim + j] = 0.0f;
    return;
  }
  if (!starts_run(step, r)) return;
  const int64_t end = run_end(step, r);
  extern __shared__ float shared[];
  float* S = shared;            // [dim, dim]: S[i * dim + j]
  float* q = S + dim * dim;     // the token's normalised, scaled query
  float* k = q + dim;           // its normalised key
  float* decay = k + dim;       // exp of its log-decays
  __shared__ float partials[1024 / kWarp];
  float* head_state = state + (static_cast<int64_t>(step.seqs[r]) * heads + h) * dim * dim;
  for (int64_t e = j; e < dim * dim; e += blockDim.x) S[e] = head_state[e];
  const float rate = expf(w.a_log[h]);
  const float scale = 1.0f / sqrtf(static_cast<float>(dim));
  for (int64_t t = r; t < end; ++t) {
    const int64_t c = h * dim + j;  // this thread's channel of the row
    float qv = 0.0f, kv = 0.0f;
    if (owner) {
      qv = rows.q[t * rows.qkv_stride + c];
      kv = rows.k[t * rows.qkv_stride + c];
      const float x = rows.f[t * width + c] + w.dt_bias[c];
      const float g = w.bounded ? w.lower_bound / (1.0f + expf(-rate * x)) : -rate * (x > 20.0f ? x : log1pf(expf(x)));
      decay[j] = expf(g);
    }
    const float q_norm = sqrtf(block_sum(qv * qv, partials) + kL2Eps);
    const float k_norm = sqrtf(block_sum(kv * kv, partials) + kL2Eps);
    if (owner) {
      q[j] = qv / q_norm * scale;
      k[j] = kv / k_norm;
    }
    __syncthreads();
    float o = 0.0f;
    if (owner) {
      const float beta = 1.0f / (1.0f + expf(-rows.beta[t * heads + h]));
      float predicted = 0.0f;
      for (int64_t i = 0; i < dim; ++i) {
        const float s = S[i * dim + j] * decay[i];
        S[i * dim + j] = s;
        predicted += s * k[i];
      }
      const float delta = (rows.v[t * rows.qkv_stride + c] - predicted) * beta;
      for (int64_t i = 0; i < dim; ++i) {
        const float s = S[i * dim + j] + k[i] * delta;
        S[i * dim + j] = s;
        o += s * q[i];
      }
    }
    const float inv = rsqrtf(block_sum(o * o, partials) / static_cast<float>(dim) + w.eps);
    if (owner) {
      const float sig = 1.0f / (1.0f + expf(-rows.gate[t * width + c]));
      out[t * width + c] = o * inv * w.norm[j] * sig;
    }
    __syncthreads();  // q, k and decay are rewritten by the next token
  }
  for (int64_t e = j; e < dim * dim; e += blockDim.x) head_state[e] = S[e];
}

std::size_t shared_bytes(int64_t dim) { return static_cast<std::size_t>(dim * dim + 3 * dim) * sizeof(float); }

}  // namespace

void gated_delta_rule_step(backend::Context& ctx, int64_t heads, int64_t dim, const DeltaRuleStepRows& rows,
                           const DeltaRuleHeadWeights& w, const StepView& step, float* state, float* out) {
  R3_CHECK(heads > 0 && heads <= 65535 && dim > 0 && dim <= kMaxDeviceDeltaRuleHeadDim,
           "delta rule (cuda): ", heads, " heads of ", dim, " (at most 65535 heads of at most ",
           kMaxDeviceDeltaRuleHeadDim, ")");
  if (step.tokens == 0) return;
  // The largest head's state is past the 48 KiB a block gets without asking.
  static std::once_flag raised;
  std::call_once(raised, [] {
    R3_CUDA_CHECK(cudaFuncSetAttribute(gated_delta_rule_runs, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared_bytes(kMaxDeviceDeltaRuleHeadDim))));
  });
  const auto threads = static_cast<unsigned>((dim + kWarp - 1) / kWarp * kWarp);
  const dim3 grid(static_cast<unsigned>(step.tokens), static_cast<unsigned>(heads));
  backend::cuda::launch_kernel(gated_delta_rule_runs, grid, threads, shared_bytes(dim), ctx.cuda_state().stream, heads,
                               dim, rows, w, step, state, out);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
