#include "models/deepseek_v4/hyper_connection.h"

#include <cmath>

#include "core/check.h"
#include "ops/activation.h"
#include "ops/cpu/dot.h"
#include "ops/sinkhorn.h"

namespace r3::models {

void unweighted_rms_norm(const float* x, int64_t n, float eps, float* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
}

HyperConnection::HyperConnection(Tensor fn, Tensor base, Tensor scale, int64_t hc, int64_t sinkhorn_iters,
                                 float hc_eps, float rms_eps)
    : fn_(std::move(fn)),
      base_(std::move(base)),
      scale_(std::move(scale)),
      hc_(hc),
      iters_(sinkhorn_iters),
      hc_eps_(hc_eps),
      rms_eps_(rms_eps) {}

void HyperConnection::mix(const float* streams, std::span<float> scratch, float* pre, float* post,
                          float* comb) const {
  const int64_t width = fn_.dim(1), mixes = fn_.dim(0);
  R3_CHECK(static_cast<int64_t>(scratch.size()) >= scratch_size(), "hyper-connection: scratch of ", scratch.size(),
           " floats, needs ", scratch_size());
  float* flat = scratch.data();
  float* logits = flat + width;
  unweighted_rms_norm(streams, width, rms_eps_, flat);
  for (int64_t m = 0; m < mixes; ++m) logits[m] = ops::dot(flat, fn_.data<float>() + m * width, width);
  const float* base = base_.data<float>();
  const float* scale = scale_.data<float>();
  const int64_t hc = hc_;
  for (int64_t i = 0; i < hc; ++i) {
    pre[i] = ops::sigmoid(logits[i] * scale[0] + base[i]) + hc_eps_;
    post[i] = 2.0f * ops::sigmoid(logits[hc + i] * scale[1] + base[hc + i]);
  }
  for (int64_t i = 0; i < hc * hc; ++i) comb[i] = logits[2 * hc + i] * scale[2] + base[2 * hc + i];
  ops::sinkhorn_mix(comb, hc, iters_, hc_eps_);
}

HyperHead::HyperHead(Tensor fn, Tensor base, Tensor scale, int64_t hc, float hc_eps, float rms_eps)
    : fn_(std::move(fn)), base_(std::move(base)), scale_(std::move(scale)), hc_(hc), hc_eps_(hc_eps), rms_eps_(rms_eps) {}

void HyperHead::collapse(const float* streams, int64_t hidden, std::span<float> scratch, float* out) const {
  const int64_t width = hc_ * hidden;
  R3_CHECK(static_cast<int64_t>(scratch.size()) >= width, "hyper head: scratch of ", scratch.size(), " floats");
  float* flat = scratch.data();
  unweighted_rms_norm(streams, width, rms_eps_, flat);
  std::fill(out, out + hidden, 0.0f);
  for (int64_t i = 0; i < hc_; ++i) {
    const float mixed = ops::dot(flat, fn_.data<float>() + i * width, width);
    const float pre = ops::sigmoid(mixed * scale_.data<float>()[0] + base_.data<float>()[i]) + hc_eps_;
    for (int64_t d = 0; d < hidden; ++d) out[d] += pre * streams[i * hidden + d];
  }
}

}  // namespace r3::models
