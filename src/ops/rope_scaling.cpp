#include "ops/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace r3::ops {

namespace {
double get_mscale(double scale, double mscale = 1.0) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }
}  // namespace

RopeFrequencies rope_frequencies(int64_t rotary_dim, double theta, const RopeScaling& s,
                                 int64_t max_position_embeddings) {
  R3_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary dim must be even and positive, got ", rotary_dim);
  const auto base = static_cast<float>(theta);
  const auto dim = static_cast<float>(rotary_dim);
  std::vector<float> pos_freqs;
  for (int64_t i = 0; i < rotary_dim / 2; ++i) pos_freqs.push_back(std::pow(base, static_cast<float>(2 * i) / dim));
  RopeFrequencies out;
  if (s.kind == RopeScaling::Kind::kDefault) {
    for (float p : pos_freqs) out.inv_freq.push_back(1.0f / p);
    return out;
  }
  // transformers 5.17 takes `factor` as given and uses original_max_position_embeddings (when
  // present) only for the correction range (checked against the GPT-OSS reference).
  const double factor = s.factor;
  const int64_t original =
      s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : max_position_embeddings;
  double attention = s.attention_factor;
  if (attention == 0.0) {
    attention = (s.mscale != 0.0 && s.mscale_all_dim != 0.0) ? get_mscale(factor, s.mscale) / get_mscale(factor, s.mscale_all_dim)
                                                             : get_mscale(factor);
  }
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(rotary_dim) * std::log(static_cast<double>(original) / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rotary_dim - 1));
  if (low == high) high += 0.001;
  const auto f = static_cast<float>(factor);
  for (std::size_t i = 0; i < pos_freqs.size(); ++i) {
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (f * pos_freqs[i]);
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                      (static_cast<float>(high) - static_cast<float>(low)),
                                  0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out.inv_freq.push_back(interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor);
  }
  out.attention_scaling = static_cast<float>(attention);
  return out;
}

double yarn_softmax_scale_factor(const RopeScaling& s) {
  if (s.kind != RopeScaling::Kind::kYarn || s.mscale_all_dim == 0.0) return 1.0;
  const double m = get_mscale(s.factor, s.mscale_all_dim);
  return m * m;
}

}  // namespace r3::ops
