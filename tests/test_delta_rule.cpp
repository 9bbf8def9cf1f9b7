// Kimi Delta Attention's gated delta rule (ops/delta_rule.h): the recurrent form against a plain
// float64 evaluation of the recurrence, the chunked form against the recurrent one (whole
// sequences, chunk boundaries inside and at the end, a prefill continued token by token), and the
// log-decays, gated norm and short convolution against their formulas. The model-level oracle is the Kimi Linear
// fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/delta_rule.h"
#include "ops/short_conv.h"

namespace r3::test {
namespace {

struct DeltaInputs {
  ops::DeltaRuleShape shape;
  int64_t tokens;
  std::vector<float> q, k, v, g, beta;
};

// Random rows with log-decays from the forget-gate formula (so in the range the models produce)
// and betas in (0, 1).
DeltaInputs random_inputs(const ops::DeltaRuleShape& shape, int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  DeltaInputs in{shape, tokens, {}, {}, {}, {}, {}};
  const int64_t kw = tokens * shape.heads * shape.key_dim, vw = tokens * shape.heads * shape.value_dim;
  for (int64_t i = 0; i < kw; ++i) in.q.push_back(normal(rng));
  for (int64_t i = 0; i < kw; ++i) in.k.push_back(normal(rng));
  for (int64_t i = 0; i < vw; ++i) in.v.push_back(normal(rng));
  std::vector<float> f(static_cast<std::size_t>(kw)), a_log(static_cast<std::size_t>(shape.heads)),
      dt_bias(static_cast<std::size_t>(shape.heads * shape.key_dim));
  for (float& x : f) x = normal(rng);
  for (float& x : a_log) x = 0.5f * normal(rng) - 1.0f;
  for (float& x : dt_bias) x = normal(rng);
  in.g.resize(static_cast<std::size_t>(kw));
  ops::delta_rule_log_decay(f.data(), tokens, shape, a_log.data(), dt_bias.data(), nullptr, in.g.data());
  for (int64_t i = 0; i < tokens * shape.heads; ++i) in.beta.push_back(1.0f / (1.0f + std::exp(-normal(rng))));
  return in;
}

ops::DeltaRuleRows rows_of(const DeltaInputs& in, int64_t first, int64_t count, std::vector<float>& out) {
  const int64_t h = in.shape.heads, dk = in.shape.key_dim, dv = in.shape.value_dim;
  return {in.q.data() + first * h * dk, in.k.data() + first * h * dk, in.v.data() + first * h * dv,
          in.g.data() + first * h * dk, in.beta.data() + first * h, count, out.data() + first * h * dv};
}

double max_relative(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}
double max_relative(const std::vector<float>& got, const std::vector<float>& want) {
  return max_relative(got, std::vector<double>(want.begin(), want.end()));
}

// The recurrence as written in transformers' recurrent form, everything in double.
std::vector<double> float64_recurrence(const DeltaInputs& in, std::vector<double>& state) {
  const int64_t H = in.shape.heads, dk = in.shape.key_dim, dv = in.shape.value_dim;
  std::vector<double> out(static_cast<std::size_t>(in.tokens * H * dv));
  for (int64_t t = 0; t < in.tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t row = t * H + h;
      std::vector<double> q(dk), k(dk);
      double qs = 0, ks = 0;
      for (int64_t i = 0; i < dk; ++i) {
        qs += double(in.q[row * dk + i]) * in.q[row * dk + i];
        ks += double(in.k[row * dk + i]) * in.k[row * dk + i];
      }
      for (int64_t i = 0; i < dk; ++i) {
        q[i] = in.q[row * dk + i] / std::sqrt(qs + 1e-6) / std::sqrt(double(dk));
        k[i] = in.k[row * dk + i] / std::sqrt(ks + 1e-6);
      }
      double* S = state.data() + h * dk * dv;
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] *= std::exp(double(in.g[row * dk + i]));
      }
      for (int64_t j = 0; j < dv; ++j) {
        double mem = 0;
        for (int64_t i = 0; i < dk; ++i) mem += S[i * dv + j] * k[i];
        const double delta = (in.v[row * dv + j] - mem) * in.beta[row];
        for (int64_t i = 0; i < dk; ++i) S[i * dv + j] += k[i] * delta;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
        out[row * dv + j] = o;
      }
    }
  }
  return out;
}

TEST(DeltaRule, RecurrentFormFollowsTheRecurrenceInDouble) {
  const ops::DeltaRuleShape shape{3, 16, 8};
  const DeltaInputs in = random_inputs(shape, 150, 1);
  std::vector<float> out(in.v.size()), state(static_cast<std::size_t>(3 * 16 * 8), 0.0f);
  ops::delta_rule_recurrent(shape, rows_of(in, 0, in.tokens, out), state.data());
  std::vector<double> state64(state.size(), 0.0);
  const std::vector<double> want = float64_recurrence(in, state64);
  EXPECT_LT(max_relative(out, want), 1e-5);
  EXPECT_LT(max_relative(state, state64), 1e-5);
}

// 150 tokens: two whole chunks of 64 and a partial one; chunks of 16 and 1 as well (a chunk of
// one position is the recurrence itself, through the chunked arithmetic).
TEST(DeltaRule, ChunkedFormEqualsTheRecurrentForm) {
  const ops::DeltaRuleShape shape{2, 16, 32};
  const DeltaInputs in = random_inputs(shape, 150, 2);
  std::vector<float> want(in.v.size()), want_state(static_cast<std::size_t>(2 * 16 * 32), 0.0f);
  ops::delta_rule_recurrent(shape, rows_of(in, 0, in.tokens, want), want_state.data());
  for (const int64_t chunk : {64, 16, 1}) {
    std::vector<float> out(in.v.size()), state(want_state.size(), 0.0f);
    std::vector<double> scratch(static_cast<std::size_t>(ops::delta_rule_chunked_scratch(shape, chunk)));
    ops::delta_rule_chunked(shape, rows_of(in, 0, in.tokens, out), chunk, state.data(), scratch.data());
    EXPECT_LT(max_relative(out, want), 1e-5) << "chunk " << chunk;
    EXPECT_LT(max_relative(state, want_state), 1e-5) << "chunk " << chunk;
  }
}

// A prefill of 100 tokens in chunks, then 50 decode steps one token at a time from its state:
// the same outputs as the whole sequence at once, and a prefill split at a chunk boundary and
// inside a chunk continues the same way.
TEST(DeltaRule, PrefillThenDecodeEqualsTheWholeSequence) {
  const ops::DeltaRuleShape shape{4, 8, 16};
  const DeltaInputs in = random_inputs(shape, 150, 3);
  std::vector<float> want(in.v.size()), state(static_cast<std::size_t>(4 * 8 * 16), 0.0f);
  std::vector<double> scratch(static_cast<std::size_t>(ops::delta_rule_chunked_scratch(shape, 64)));
  ops::delta_rule_chunked(shape, rows_of(in, 0, in.tokens, want), 64, state.data(), scratch.data());
  for (const int64_t prefill : {100, 64, 37}) {
    std::vector<float> out(in.v.size()), s(state.size(), 0.0f);
    ops::delta_rule_chunked(shape, rows_of(in, 0, prefill, out), 64, s.data(), scratch.data());
    for (int64_t t = prefill; t < in.tokens; ++t) ops::delta_rule_recurrent(shape, rows_of(in, t, 1, out), s.data());
    EXPECT_LT(max_relative(out, want), 1e-5) << "prefill " << prefill;
    EXPECT_LT(max_relative(s, state), 1e-5) << "prefill " << prefill;
  }
}

TEST(DeltaRule, LogDecaysFollowBothPublishedForms) {
  const ops::DeltaRuleShape shape{2, 2, 1};
  const std::vector<float> f = {-3.0f, 0.5f, 19.0f, 25.0f}, a_log = {0.3f, -1.2f}, dt_bias = {0.25f, -0.5f, 1.5f, 0.0f};
  std::vector<float> g(4), bounded(4);
  const float lower_bound = -5.0f;
  ops::delta_rule_log_decay(f.data(), 1, shape, a_log.data(), dt_bias.data(), nullptr, g.data());
  ops::delta_rule_log_decay(f.data(), 1, shape, a_log.data(), dt_bias.data(), &lower_bound, bounded.data());
  for (int c = 0; c < 4; ++c) {
    const double rate = std::exp(double(a_log[c / 2])), x = double(f[c]) + dt_bias[c];
    const double softplus = x > 20 ? x : std::log(1 + std::exp(x));  // transformers' thresholded softplus
    EXPECT_NEAR(g[c], -rate * softplus, 1e-5 * std::max(1.0, rate * softplus)) << c;
    EXPECT_NEAR(bounded[c], lower_bound / (1 + std::exp(-rate * x)), 1e-6) << c;
    EXPECT_LT(g[c], 0.0f);
    EXPECT_TRUE(bounded[c] < 0.0f && bounded[c] > lower_bound) << c;
  }
  EXPECT_EQ(g[3], static_cast<float>(-std::exp(double(a_log[1])) * 25.0));  // above the threshold: linear
}

TEST(DeltaRule, GatedNormScalesEachHeadByItsRmsAndTheGate) {
  const std::vector<float> x = {1, 2, 3, 4, -1, 0, 0, 1}, gate = {0, 1, -1, 2, 3, 0, -2, 0}, weight = {1, 0.5f, 2, 1};
  std::vector<float> y(8);
  ops::gated_rms_norm_heads(x.data(), gate.data(), weight.data(), 1, 2, 4, 1e-6f, y.data());
  for (int h = 0; h < 2; ++h) {
    double ms = 0;
    for (int j = 0; j < 4; ++j) ms += double(x[h * 4 + j]) * x[h * 4 + j] / 4;
    for (int j = 0; j < 4; ++j) {
      const double want = x[h * 4 + j] / std::sqrt(ms + 1e-6) * weight[j] / (1 + std::exp(-double(gate[h * 4 + j])));
      EXPECT_NEAR(y[h * 4 + j], want, 1e-6) << h << ", " << j;
    }
  }
}

// The short convolution: the whole sequence against the zero-padded convolution written out, and
// the same sequence in pieces of 1, 2 and 5 tokens through the kept state (pieces shorter than
// the state included) giving the same outputs and the same final state.
TEST(ShortConv, PiecesThroughTheStateEqualTheWholeSequence) {
  const int64_t tokens = 23, channels = 6, kernel = 4;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * channels), w(channels * kernel);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  std::vector<float> whole(x.size()), state((kernel - 1) * channels, 0.0f);
  ops::short_conv_silu(x.data(), tokens, channels, w.data(), kernel, state.data(), whole.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < kernel; ++j) {
        const int64_t p = t - (kernel - 1) + j;
        if (p >= 0) sum += double(w[c * kernel + j]) * x[p * channels + c];
      }
      EXPECT_NEAR(whole[t * channels + c], sum / (1 + std::exp(-sum)), 1e-6) << t << ", " << c;
    }
  }
  for (const int64_t piece : {1, 2, 5}) {
    std::vector<float> out(x.size()), s((kernel - 1) * channels, 0.0f);
    for (int64_t t = 0; t < tokens; t += piece) {
      const int64_t n = std::min(piece, tokens - t);
      ops::short_conv_silu(x.data() + t * channels, n, channels, w.data(), kernel, s.data(), out.data() + t * channels);
    }
    EXPECT_EQ(out, whole) << "pieces of " << piece;
    EXPECT_EQ(s, state) << "pieces of " << piece;
  }
}

}  // namespace
}  // namespace r3::test
