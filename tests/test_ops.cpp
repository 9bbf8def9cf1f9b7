// Every CPU op against a plain double-precision loop, and bit-identical for any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/context.h"
#include "test_support.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/grouped_projection.h"
#include "ops/hyper_connection_mix.h"
#include "ops/lightning_indexer.h"
#include "ops/latent_attention.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope_scaling.h"
#include "ops/rotary.h"
#include "ops/topk.h"
#include "ops/window_pool.h"

namespace r3::ops {
namespace {

using test::float_values;

void expect_close(const Tensor& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(static_cast<std::size_t>(got.numel()), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got.data<float>()[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

TEST(Ops, LinearMatchesNaiveLoopAndIgnoresThreadCount) {
  for (auto [m, k, n] : {std::tuple{1, 64, 320}, {19, 64, 8}, {33, 100, 37}, {5, 7, 3}}) {
    Tensor x = test::random_normal({m, k}, 1), w = test::random_normal({n, k}, 2), b = test::random_normal({n}, 3);
    std::vector<double> want(static_cast<std::size_t>(m * n));
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double s = b.data<float>()[j];
        for (int p = 0; p < k; ++p) s += double(x.data<float>()[i * k + p]) * w.data<float>()[j * k + p];
        want[static_cast<std::size_t>(i * n + j)] = s;
      }
    }
    std::vector<float> first;
    for (int threads : {1, 2, 5}) {
      backend::Context ctx(threads);
      Tensor y = Tensor::empty(DType::F32, {m, n});
      linear(ctx, x, w, &b, y);
      expect_close(y, want, 1e-5);
      if (first.empty()) first = float_values(y);
      EXPECT_EQ(float_values(y), first) << threads << " threads";
    }
  }
}

TEST(Ops, LinearRowsDoNotDependOnOtherRows) {
  backend::Context ctx(2);
  Tensor x = test::random_normal({40, 96}, 4), w = test::random_normal({50, 96}, 5);
  Tensor all = Tensor::empty(DType::F32, {40, 50}), one = Tensor::empty(DType::F32, {1, 50});
  linear(ctx, x, w, nullptr, all);
  for (int64_t r : {0, 17, 39}) {
    Tensor row = Tensor::empty(DType::F32, {1, 96});
    std::copy_n(x.data<float>() + r * 96, 96, row.data<float>());
    linear(ctx, row, w, nullptr, one);
    EXPECT_EQ(float_values(one), std::vector<float>(all.data<float>() + r * 50, all.data<float>() + r * 50 + 50));
  }
}

// MLA with W_k / W_v absorbed, through a scattered block table, against expanding every cached
// latent into per-head keys and values in double precision.
TEST(Ops, LatentAttentionMatchesExpandedKeysAndValues) {
  const LatentAttentionShape sh{3, 4, 2, 5, 6};  // heads, nope, rope, value, lora
  const int64_t len = 7, block = 2, qk = sh.nope + sh.rope;
  Tensor q = test::random_normal({2, sh.heads * qk}, 21);
  Tensor kv_b = test::random_normal({sh.heads * (sh.nope + sh.value), sh.lora}, 22);
  const std::vector<int32_t> table = {3, 0, 2, 1};  // position p lives in block table[p / 2]
  Tensor latents = test::random_normal({4 * block, sh.lora}, 23), rope_keys = test::random_normal({4 * block, sh.rope}, 24);
  const PagedKv kv{latents.data<float>(), rope_keys.data<float>(), sh.lora, sh.rope, block, table};
  const std::vector<KvWindow> windows = {{kv, 0, len}, {}};  // the second token is padding
  Tensor out = Tensor::empty(DType::F32, {2, sh.heads * sh.value});
  backend::Context ctx(2);
  const float scale = 0.37f;
  latent_attention(ctx, q, kv_b, windows, sh, scale, out);
  const float* w = kv_b.data<float>();
  for (int64_t h = 0; h < sh.heads; ++h) {
    const float* wk = w + h * (sh.nope + sh.value) * sh.lora;
    const float* wv = wk + sh.nope * sh.lora;
    const float* qh = q.data<float>() + h * qk;
    std::vector<double> scores(static_cast<std::size_t>(len));
    double max_score = -INFINITY;
    for (int64_t p = 0; p < len; ++p) {
      const float* lat = kv.key_row(p);
      double sc = 0;
      for (int64_t i = 0; i < sh.nope; ++i) {
        double k = 0;  // key channel i of head h: W_k row i . latent
        for (int64_t c = 0; c < sh.lora; ++c) k += double(wk[i * sh.lora + c]) * lat[c];
        sc += double(qh[i]) * k;
      }
      for (int64_t r = 0; r < sh.rope; ++r) sc += double(qh[sh.nope + r]) * kv.value_row(p)[r];
      scores[static_cast<std::size_t>(p)] = sc * scale;
      max_score = std::max(max_score, sc * scale);
    }
    double denom = 0;
    for (double& x : scores) denom += (x = std::exp(x - max_score));
    for (int64_t i = 0; i < sh.value; ++i) {
      double want = 0;
      for (int64_t p = 0; p < len; ++p) {
        double v = 0;  // value channel i of head h at position p
        for (int64_t c = 0; c < sh.lora; ++c) v += double(wv[i * sh.lora + c]) * kv.key_row(p)[c];
        want += scores[static_cast<std::size_t>(p)] / denom * v;
      }
      EXPECT_NEAR(out.data<float>()[h * sh.value + i], want, 1e-5 * (1 + std::fabs(want))) << "head " << h << " channel " << i;
      EXPECT_EQ(out.data<float>()[sh.heads * sh.value + h * sh.value + i], 0.0f);  // padding row
    }
  }
}

TEST(Ops, HyperConnectionCollapseAndExpandMatchDoubleLoops) {
  const int64_t tokens = 2, hc = 3, hidden = 5;
  Tensor streams = test::random_normal({tokens, hc, hidden}, 31), y = test::random_normal({tokens, hidden}, 32);
  const Tensor pre = test::random_normal({tokens, hc}, 33), post = test::random_normal({tokens, hc}, 34);
  const Tensor comb = test::random_normal({tokens, hc, hc}, 35);
  Tensor x = Tensor::empty(DType::F32, {tokens, hidden});
  hc_collapse(streams, pre.data<float>(), x);
  const std::vector<float> before = float_values(streams);
  hc_expand(post.data<float>(), comb.data<float>(), y, streams);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t d = 0; d < hidden; ++d) {
      double want = 0;
      for (int64_t i = 0; i < hc; ++i) want += double(pre.data<float>()[t * hc + i]) * before[(t * hc + i) * hidden + d];
      EXPECT_NEAR(x.data<float>()[t * hidden + d], want, 1e-5 * (1 + std::fabs(want)));
      for (int64_t k = 0; k < hc; ++k) {
        double mixed = double(post.data<float>()[t * hc + k]) * y.data<float>()[t * hidden + d];
        for (int64_t j = 0; j < hc; ++j) {
          mixed += double(comb.data<float>()[(t * hc + j) * hc + k]) * before[(t * hc + j) * hidden + d];
        }
        EXPECT_NEAR(streams.data<float>()[(t * hc + k) * hidden + d], mixed, 1e-5 * (1 + std::fabs(mixed)));
      }
    }
  }
}

TEST(Ops, GatedWindowPoolMatchesDoubleSoftmax) {
  for (bool overlap : {false, true}) {
    const WindowPoolShape shape{4, 3, overlap ? 6 : 3, overlap};
    const Tensor kv = test::random_normal({12, shape.width}, 41), gate = test::random_normal({12, shape.width}, 42);
    const Tensor bias = test::random_normal({shape.rate, shape.width}, 43);
    for (int64_t w : {0, 2}) {
      std::vector<float> pooled(3);
      gated_window_pool(kv.data<float>(), gate.data<float>(), bias.data<float>(), shape, w, pooled.data());
      for (int64_t c = 0; c < shape.dim; ++c) {
        std::vector<std::pair<double, double>> cand;  // (logit, value)
        auto add = [&](int64_t row, int64_t j, int64_t col) {
          cand.emplace_back(double(gate.data<float>()[row * shape.width + col]) + bias.data<float>()[j * shape.width + col],
                            kv.data<float>()[row * shape.width + col]);
        };
        if (overlap && w > 0) for (int64_t j = 0; j < shape.rate; ++j) add((w - 1) * shape.rate + j, j, c);
        for (int64_t j = 0; j < shape.rate; ++j) add(w * shape.rate + j, j, (overlap ? shape.dim : 0) + c);
        double mx = -INFINITY, denom = 0, want = 0;
        for (auto& [l, v] : cand) mx = std::max(mx, l);
        for (auto& [l, v] : cand) denom += std::exp(l - mx);
        for (auto& [l, v] : cand) want += std::exp(l - mx) / denom * v;
        EXPECT_NEAR(pooled[static_cast<std::size_t>(c)], want, 1e-5 * (1 + std::fabs(want)))
            << "overlap " << overlap << " window " << w << " channel " << c;
      }
    }
  }
}

TEST(Ops, LightningIndexScoresAndGroupedProjectionMatchDoubleLoops) {
  const int64_t heads = 3, dim = 8, n = 5;
  const Tensor q = test::random_normal({heads, dim}, 51), w = test::random_normal({heads}, 52), keys = test::random_normal({n, dim}, 53);
  std::vector<float> scores(n);
  lightning_index_scores(q.data<float>(), w.data<float>(), keys.data<float>(), n, heads, dim, scores.data());
  for (int64_t s = 0; s < n; ++s) {
    double want = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double qk = 0;
      for (int64_t c = 0; c < dim; ++c) qk += double(q.data<float>()[h * dim + c]) * keys.data<float>()[s * dim + c];
      want += std::max(qk, 0.0) / std::sqrt(double(dim)) * w.data<float>()[h];
    }
    EXPECT_NEAR(scores[static_cast<std::size_t>(s)], want, 1e-5 * (1 + std::fabs(want))) << "entry " << s;
  }
  const int64_t groups = 2, in = 4, out = 3, tokens = 2;
  const Tensor x = test::random_normal({tokens, groups * in}, 54), wg = test::random_normal({groups * out, in}, 55);
  Tensor y = Tensor::empty(DType::F32, {tokens, groups * out});
  grouped_projection(x, wg, groups, y);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < out; ++r) {
        double want = 0;
        for (int64_t c = 0; c < in; ++c) want += double(x.data<float>()[t * groups * in + g * in + c]) * wg.data<float>()[(g * out + r) * in + c];
        EXPECT_NEAR(y.data<float>()[t * groups * out + g * out + r], want, 1e-5 * (1 + std::fabs(want)));
      }
    }
  }
}

TEST(Ops, RmsNormMatchesNaiveLoop) {
  backend::Context ctx(2);
  Tensor x = test::random_normal({7, 48}, 6), w = test::random_normal({48}, 7);
  Tensor y = Tensor::empty(DType::F32, {7, 48}), y_plain = Tensor::empty(DType::F32, {7, 48});
  rms_norm(ctx, x, &w, 1e-6f, y);
  rms_norm(ctx, x, nullptr, 1e-6f, y_plain);
  std::vector<double> want, want_plain;
  for (int r = 0; r < 7; ++r) {
    double ss = 0;
    for (int i = 0; i < 48; ++i) ss += double(x.data<float>()[r * 48 + i]) * x.data<float>()[r * 48 + i];
    const double inv = 1.0 / std::sqrt(ss / 48 + 1e-6);
    for (int i = 0; i < 48; ++i) {
      want.push_back(x.data<float>()[r * 48 + i] * inv * w.data<float>()[i]);
      want_plain.push_back(x.data<float>()[r * 48 + i] * inv);
    }
  }
  expect_close(y, want, 1e-6);
  expect_close(y_plain, want_plain, 1e-6);
  rms_norm(ctx, x, &w, 1e-6f, x);  // in place
  expect_close(x, want, 1e-6);
}

TEST(Ops, RotaryMatchesNaiveRotateHalf) {
  const int64_t tokens = 3, heads = 2, dim = 8;
  Tensor x = test::random_normal({tokens, heads, dim}, 8);
  const std::vector<float> before = float_values(x);
  const std::vector<int32_t> positions = {0, 5, 31};
  backend::Context ctx(1);
  Rotary(dim, 10000.0).apply(ctx, x, positions);
  std::vector<double> want(before.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < dim / 2; ++i) {
        const double angle = positions[t] / std::pow(10000.0, 2.0 * i / dim);
        const std::size_t base = static_cast<std::size_t>((t * heads + h) * dim);
        const double a = before[base + i], b = before[base + i + dim / 2];
        want[base + i] = a * std::cos(angle) - b * std::sin(angle);
        want[base + i + dim / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  expect_close(x, want, 1e-5);
  EXPECT_THROW(Rotary(7, 10000.0), Error);
}

TEST(Ops, AttentionMatchesNaiveGroupedQueryAttention) {
  const int64_t heads = 4, kv_heads = 2, dim = 8, len = 6;
  Tensor q = test::random_normal({2, heads, dim}, 9);
  Tensor keys = test::random_normal({len, kv_heads * dim}, 10), vals = test::random_normal({len, kv_heads * dim}, 11);
  // Token 0 sees 3 rows, token 1 sees rows 2..5 (a sliding window of 4).
  // The rows as one block of the paged view.
  const std::vector<int32_t> table = {0};
  const PagedKv kv{keys.data<float>(), vals.data<float>(), kv_heads * dim, kv_heads * dim, len, table};
  std::vector<KvWindow> rows = {{kv, 0, 3}, {kv, 2, 6}};
  const float scale = 0.3f;
  std::vector<float> first;
  for (int threads : {1, 3}) {
    backend::Context ctx(threads);
    Tensor out = Tensor::empty(DType::F32, {2, heads, dim});
    attention(ctx, q, rows, kv_heads, scale, out);
    std::vector<double> want;
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t start = t == 0 ? 0 : 2, n = t == 0 ? 3 : 4;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / (heads / kv_heads);
        std::vector<double> s(static_cast<std::size_t>(n));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t c = 0; c < dim; ++c)
            d += double(q.data<float>()[(t * heads + h) * dim + c]) * keys.data<float>()[(start + j) * kv_heads * dim + g * dim + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t c = 0; c < dim; ++c) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += s[j] / sum * vals.data<float>()[(start + j) * kv_heads * dim + g * dim + c];
          want.push_back(o);
        }
      }
    }
    expect_close(out, want, 1e-5);
    if (first.empty()) first = float_values(out);
    EXPECT_EQ(float_values(out), first);
  }
}

TEST(Ops, SoftmaxAndTopK) {
  std::vector<float> v = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  std::vector<float> p = v;
  softmax(p);
  double z = 0;
  for (float x : v) z += std::exp(double(x));
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(p[i], std::exp(double(v[i])) / z, 1e-7);
  // Largest first; the tie between indices 1 and 3 goes to the lower index.
  EXPECT_EQ(topk_indices(v, 3), (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(topk_indices(v, 0), std::vector<int32_t>{});
  EXPECT_THROW(topk_indices(v, 6), Error);
}

TEST(Ops, SiluAndMul) {
  backend::Context ctx(1);
  Tensor g = Tensor::from<float>({-2.0f, 0.0f, 1.5f}, {1, 3}), u = Tensor::from<float>({3.0f, 4.0f, -1.0f}, {1, 3});
  Tensor o = Tensor::empty(DType::F32, {1, 3});
  silu_and_mul(ctx, g, u, o);
  for (int i = 0; i < 3; ++i) {
    const double gv = g.data<float>()[i];
    EXPECT_NEAR(o.data<float>()[i], gv / (1 + std::exp(-gv)) * u.data<float>()[i], 1e-6);
  }
}

}  // namespace
}  // namespace r3::ops

namespace r3::ops {
namespace {

TEST(RopeScaling, YarnExtrapolatesHighFrequenciesAndInterpolatesLowOnes) {
  const auto plain = rope_frequencies(16, 10000.0, {}, 256);
  ASSERT_EQ(plain.inv_freq.size(), 8u);
  EXPECT_EQ(plain.attention_scaling, 1.0f);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(plain.inv_freq[i], 1.0f / std::pow(10000.0f, 2.0f * i / 16.0f));

  RopeScaling yarn;
  yarn.kind = RopeScaling::Kind::kYarn;
  yarn.factor = 32;
  yarn.original_max_position_embeddings = 4096;
  yarn.truncate = false;
  const auto scaled = rope_frequencies(16, 10000.0, yarn, 256);
  // Correction range for beta_fast 32 / beta_slow 1 over 4096 positions: dims 2.62 .. 5.63.
  EXPECT_FLOAT_EQ(scaled.inv_freq[0], plain.inv_freq[0]);         // fully extrapolated
  EXPECT_FLOAT_EQ(scaled.inv_freq[7], plain.inv_freq[7] / 32.0f);  // fully interpolated
  EXPECT_LT(scaled.inv_freq[4], plain.inv_freq[4]);
  EXPECT_GT(scaled.inv_freq[4], plain.inv_freq[4] / 32.0f);
  EXPECT_NEAR(scaled.attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-6);
  // DeepSeek's softmax correction needs mscale_all_dim.
  EXPECT_EQ(yarn_softmax_scale_factor(yarn), 1.0);
  yarn.mscale_all_dim = 1.0;
  EXPECT_NEAR(yarn_softmax_scale_factor(yarn), std::pow(0.1 * std::log(32.0) + 1.0, 2), 1e-9);
}

}  // namespace
}  // namespace r3::ops
