// The causal short convolution with SiLU on the GPU (ops/short_conv.h): one thread per (run,
// channel) walks its run's rows in order, keeping the channel's last kernel - 1 inputs in
// registers, and writes them back as the sequence's new state. Each output is the CPU's sum, in
// double and in the same tap order, so the two agree to the last rounding of exp.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/sequence_runs.cuh"
#include "ops/short_conv.h"

namespace r3::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxTaps = 64;  // the CPU's limit

__global__ void short_conv_silu_runs(ConvInputs in, const float* __restrict__ weight, int64_t kernel, StepView step,
                                     float* __restrict__ state, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t channels = in.parts * in.part_channels;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= step.tokens * channels) return;
  const int64_t r = i / channels, c = i % channels;
  if (!starts_run(step, r)) return;
  const int64_t end = run_end(step, r), kept = kernel - 1;
  const float* w = weight + c * kernel;
  const float* x = in.part[c / in.part_channels] + c % in.part_channels;
  float* s = state + (static_cast<int64_t>(step.seqs[r]) * channels + c) * kept;
  float window[kMaxTaps - 1];  // the channel's last `kept` inputs, oldest first
  for (int64_t j = 0; j < kept; ++j) window[j] = s[j];
  for (int64_t t = r; t < end; ++t) {
    const float input = x[t * in.stride];
    double sum = 0;
    for (int64_t j = 0; j < kept; ++j) sum += static_cast<double>(w[j]) * window[j];
    sum += static_cast<double>(w[kept]) * input;
    out[t * channels + c] = static_cast<float>(sum / (1.0 + exp(-sum)));
    for (int64_t j = 0; j + 1 < kept; ++j) window[j] = window[j + 1];
    if (kept > 0) window[kept - 1] = input;
  }
  for (int64_t j = 0; j < kept; ++j) s[j] = window[j];
}

}  // namespace

void short_conv_silu_step(backend::Context& ctx, const ConvInputs& in, const float* weight, int64_t kernel,
                          const StepView& step, float* state, float* out) {
  R3_CHECK(kernel >= 1 && kernel <= kMaxTaps, "short convolution (cuda): kernel of ", kernel, " taps (1 to ",
           kMaxTaps, ")");
  R3_CHECK(in.parts >= 1 && in.parts <= ConvInputs::kMaxParts && in.part_channels > 0 && in.stride > 0,
           "short convolution (cuda): ", in.parts, " parts of ", in.part_channels, " channels");
  const int64_t threads = step.tokens * in.parts * in.part_channels;
  if (threads == 0) return;
  backend::cuda::launch_kernel(short_conv_silu_runs, static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads,
                               0, ctx.cuda_state().stream, in, weight, kernel, step, state, out);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
