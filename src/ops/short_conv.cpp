#include "ops/short_conv.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "ops/cpu/step_blocks.h"

namespace r3::ops {

void short_conv_silu(const float* x, int64_t tokens, int64_t channels, const float* weight, int64_t kernel,
                     float* state, float* out) {
  R3_CHECK(kernel >= 1 && kernel <= 64, "short convolution: kernel of ", kernel, " taps (1 to 64)");
  const int64_t kept = kernel - 1;
  for (int64_t c = 0; c < channels; ++c) {
    const float* w = weight + c * kernel;
    float* s = state + c * kept;
    // Input position p of the extended sequence [state | x]: p < kept from the state.
    auto input = [&](int64_t p) { return p < kept ? s[p] : x[(p - kept) * channels + c]; };
    for (int64_t t = 0; t < tokens; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < kernel; ++j) sum += static_cast<double>(w[j]) * input(t + j);
      out[t * channels + c] = static_cast<float>(sum / (1.0 + std::exp(-sum)));
    }
    // The new state: the last `kept` inputs of the extended sequence (read before any is written).
    float last[64];
    for (int64_t j = 0; j < kept; ++j) last[j] = input(tokens + j);
    for (int64_t j = 0; j < kept; ++j) s[j] = last[j];
  }
}

namespace cpu {

void short_conv_silu_step(backend::Context& ctx, const ConvInputs& in, const float* weight, int64_t kernel,
                          const StepView& step, float* state, float* out) {
  R3_CHECK(in.parts >= 1 && in.parts <= ConvInputs::kMaxParts && in.stride >= in.part_channels,
           "short convolution: ", in.parts, " parts of ", in.part_channels, " channels, rows of ", in.stride);
  const int64_t pc = in.part_channels, channels = in.parts * pc, kept = kernel - 1;
  backend::Workspace::Scope scope(ctx.workspace());
  const std::span<float> rows = ctx.workspace().array<float>(step.tokens * pc);
  const std::span<float> convolved = ctx.workspace().array<float>(step.tokens * pc);
  for_each_sequence_run(step, [&](int32_t seq, int64_t first, int64_t end) {
    const int64_t n = end - first;
    for (int i = 0; i < in.parts; ++i) {
      // The run's rows of this part, gathered when they are columns of a wider row.
      const float* x = in.part[i] + first * in.stride;
      if (in.stride != pc) {
        for (int64_t t = 0; t < n; ++t) {
          std::memcpy(rows.data() + t * pc, x + t * in.stride, sizeof(float) * static_cast<std::size_t>(pc));
        }
        x = rows.data();
      }
      short_conv_silu(x, n, pc, weight + i * pc * kernel, kernel, state + (seq * channels + i * pc) * kept,
                      convolved.data());
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(out + (first + t) * channels + i * pc, convolved.data() + t * pc,
                    sizeof(float) * static_cast<std::size_t>(pc));
      }
    }
  });
}

}  // namespace cpu

}  // namespace r3::ops
