#include "ops/short_conv.h"

#include <cmath>

#include "core/check.h"

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

}  // namespace r3::ops
