#include "models/deepseek_v4/hyper_connection.h"

#include <cmath>

#include "ops/activation.h"
#include "ops/dot.h"

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

HyperConnection::Mix HyperConnection::mix(const float* streams) const {
  const int64_t width = fn_.dim(1), mixes = fn_.dim(0);
  std::vector<float> flat(static_cast<std::size_t>(width)), logits(static_cast<std::size_t>(mixes));
  unweighted_rms_norm(streams, width, rms_eps_, flat.data());
  for (int64_t m = 0; m < mixes; ++m) logits[m] = ops::dot(flat.data(), fn_.data<float>() + m * width, width);
  const float* base = base_.data<float>();
  const float* scale = scale_.data<float>();
  Mix out;
  const auto hc = static_cast<std::size_t>(hc_);
  for (std::size_t i = 0; i < hc; ++i) {
    out.pre.push_back(ops::sigmoid(logits[i] * scale[0] + base[i]) + hc_eps_);
    out.post.push_back(2.0f * ops::sigmoid(logits[hc + i] * scale[1] + base[hc + i]));
  }
  // comb: softmax over each row (last axis), + eps, then column / row normalisations.
  out.comb.resize(hc * hc);
  for (std::size_t j = 0; j < hc; ++j) {
    float max_logit = -INFINITY;
    for (std::size_t k = 0; k < hc; ++k) {
      const float v = logits[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
      out.comb[j * hc + k] = v;
      max_logit = std::max(max_logit, v);
    }
    float sum = 0;
    for (std::size_t k = 0; k < hc; ++k) sum += (out.comb[j * hc + k] = std::exp(out.comb[j * hc + k] - max_logit));
    for (std::size_t k = 0; k < hc; ++k) out.comb[j * hc + k] = out.comb[j * hc + k] / sum + hc_eps_;
  }
  auto normalise_columns = [&] {
    for (std::size_t k = 0; k < hc; ++k) {
      float sum = 0;
      for (std::size_t j = 0; j < hc; ++j) sum += out.comb[j * hc + k];
      for (std::size_t j = 0; j < hc; ++j) out.comb[j * hc + k] /= sum + hc_eps_;
    }
  };
  auto normalise_rows = [&] {
    for (std::size_t j = 0; j < hc; ++j) {
      float sum = 0;
      for (std::size_t k = 0; k < hc; ++k) sum += out.comb[j * hc + k];
      for (std::size_t k = 0; k < hc; ++k) out.comb[j * hc + k] /= sum + hc_eps_;
    }
  };
  normalise_columns();
  for (int64_t it = 1; it < iters_; ++it) {
    normalise_rows();
    normalise_columns();
  }
  return out;
}

HyperHead::HyperHead(Tensor fn, Tensor base, Tensor scale, int64_t hc, float hc_eps, float rms_eps)
    : fn_(std::move(fn)), base_(std::move(base)), scale_(std::move(scale)), hc_(hc), hc_eps_(hc_eps), rms_eps_(rms_eps) {}

void HyperHead::collapse(const float* streams, int64_t hidden, float* out) const {
  const int64_t width = hc_ * hidden;
  std::vector<float> flat(static_cast<std::size_t>(width));
  unweighted_rms_norm(streams, width, rms_eps_, flat.data());
  std::fill(out, out + hidden, 0.0f);
  for (int64_t i = 0; i < hc_; ++i) {
    const float mixed = ops::dot(flat.data(), fn_.data<float>() + i * width, width);
    const float pre = ops::sigmoid(mixed * scale_.data<float>()[0] + base_.data<float>()[i]) + hc_eps_;
    for (int64_t d = 0; d < hidden; ++d) out[d] += pre * streams[i * hidden + d];
  }
}

}  // namespace r3::models
