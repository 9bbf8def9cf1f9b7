#include "ops/delta_rule.h"

#include <algorithm>
#include <cmath>

#include <cstring>

#include "core/check.h"
#include "ops/cpu/step_blocks.h"

namespace r3::ops {

namespace {

constexpr double kL2Eps = 1e-6;  // transformers' (and fla's) l2norm: x / sqrt(sum x² + eps)

void check_delta_shape(const DeltaRuleShape& s) {
  R3_CHECK(s.heads > 0 && s.key_dim > 0 && s.value_dim > 0 && s.key_dim <= kMaxDeltaRuleHeadDim &&
               s.value_dim <= kMaxDeltaRuleHeadDim,
           "delta rule: ", s.heads, " heads of ", s.key_dim, " x ", s.value_dim, " (head dims at most ",
           kMaxDeltaRuleHeadDim, ")");
}

// x / sqrt(sum x² + eps) * scale, in double.
void l2_normalised(const float* x, int64_t n, double scale, double* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const double norm = std::sqrt(sum + kL2Eps);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) / norm * scale;
}

}  // namespace

void delta_rule_recurrent(const DeltaRuleShape& s, const DeltaRuleRows& r, float* state) {
  check_delta_shape(s);
  const int64_t dk = s.key_dim, dv = s.value_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  double q[kMaxDeltaRuleHeadDim], k[kMaxDeltaRuleHeadDim], delta[kMaxDeltaRuleHeadDim];
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t row = t * s.heads + h;
      l2_normalised(r.q + row * dk, dk, scale, q);
      l2_normalised(r.k + row * dk, dk, 1.0, k);
      const float* v = r.v + row * dv;
      const float* g = r.g + row * dk;
      const double beta = r.beta[row];
      float* S = state + h * dk * dv;
      for (int64_t i = 0; i < dk; ++i) {
        const double decay = std::exp(static_cast<double>(g[i]));
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] = static_cast<float>(S[i * dv + j] * decay);
      }
      for (int64_t j = 0; j < dv; ++j) {
        double predicted = 0;
        for (int64_t i = 0; i < dk; ++i) predicted += S[i * dv + j] * k[i];
        delta[j] = (v[j] - predicted) * beta;
      }
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] = static_cast<float>(S[i * dv + j] + k[i] * delta[j]);
      }
      float* out = r.out + row * dv;
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
        out[j] = static_cast<float>(o);
      }
    }
  }
}

int64_t delta_rule_chunked_scratch(const DeltaRuleShape& s, int64_t chunk) {
  return chunk * (4 * s.key_dim + 3 * s.value_dim + chunk + 1) + s.key_dim * s.value_dim;
}

void delta_rule_chunked(const DeltaRuleShape& s, const DeltaRuleRows& r, int64_t chunk, float* state,
                        double* scratch) {
  check_delta_shape(s);
  R3_CHECK(chunk > 0, "delta rule: chunk of ", chunk, " positions");
  const int64_t dk = s.key_dim, dv = s.value_dim, C = chunk;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  // Per chunk and head: normalised q and k, cumulative log-decays, beta-weighted keys (kb), the
  // UT-transformed values (u), keys (w), the corrected values (vnew), the triangular matrix (a),
  // and the head's state in double.
  double* q = scratch;
  double* k = q + C * dk;
  double* gc = k + C * dk;
  double* w = gc + C * dk;
  double* u = w + C * dk;
  double* vnew = u + C * dv;
  double* vb = vnew + C * dv;
  double* a = vb + C * dv;
  double* S = a + C * C;
  double* updated = S + dk * dv;  // one row of the substitution
  for (int64_t h = 0; h < s.heads; ++h) {
    float* head_state = state + h * dk * dv;
    for (int64_t e = 0; e < dk * dv; ++e) S[e] = head_state[e];
    for (int64_t first = 0; first < r.tokens; first += C) {
      const int64_t n = std::min(C, r.tokens - first);
      for (int64_t p = 0; p < n; ++p) {
        const int64_t row = (first + p) * s.heads + h;
        l2_normalised(r.q + row * dk, dk, scale, q + p * dk);
        l2_normalised(r.k + row * dk, dk, 1.0, k + p * dk);
        const double beta = r.beta[row];
        for (int64_t i = 0; i < dk; ++i) {
          gc[p * dk + i] = (p > 0 ? gc[(p - 1) * dk + i] : 0.0) + r.g[row * dk + i];
        }
        for (int64_t j = 0; j < dv; ++j) vb[p * dv + j] = r.v[row * dv + j] * beta;
      }
      // a[p][b] (b < p) = -beta_p sum_i k_p[i] k_b[i] exp(gc_p[i] - gc_b[i]); then (I + a)'s
      // forward substitution row by row, as transformers does, each row from the rows above it.
      for (int64_t p = 0; p < n; ++p) {
        const double beta = r.beta[(first + p) * s.heads + h];
        for (int64_t b = 0; b < p; ++b) {
          double dot = 0;
          for (int64_t i = 0; i < dk; ++i) dot += k[p * dk + i] * k[b * dk + i] * std::exp(gc[p * dk + i] - gc[b * dk + i]);
          a[p * C + b] = -beta * dot;
        }
      }
      for (int64_t p = 1; p < n; ++p) {
        for (int64_t b = 0; b < p; ++b) {
          double sum = a[p * C + b];
          for (int64_t m = b + 1; m < p; ++m) sum += a[p * C + m] * a[m * C + b];
          updated[b] = sum;
        }
        for (int64_t b = 0; b < p; ++b) a[p * C + b] = updated[b];
      }
      // u = T vb and w = T (beta k exp(gc)), T = I + a (lower triangular).
      for (int64_t p = 0; p < n; ++p) {
        for (int64_t j = 0; j < dv; ++j) {
          double sum = vb[p * dv + j];
          for (int64_t b = 0; b < p; ++b) sum += a[p * C + b] * vb[b * dv + j];
          u[p * dv + j] = sum;
        }
        for (int64_t i = 0; i < dk; ++i) {
          auto kbe = [&](int64_t b) {
            return k[b * dk + i] * r.beta[(first + b) * s.heads + h] * std::exp(gc[b * dk + i]);
          };
          double sum = kbe(p);
          for (int64_t b = 0; b < p; ++b) sum += a[p * C + b] * kbe(b);
          w[p * dk + i] = sum;
        }
      }
      // vnew = u - w S; out = (q exp(gc)) S + (causal q k decay) vnew.
      for (int64_t p = 0; p < n; ++p) {
        for (int64_t j = 0; j < dv; ++j) {
          double predicted = 0;
          for (int64_t i = 0; i < dk; ++i) predicted += w[p * dk + i] * S[i * dv + j];
          vnew[p * dv + j] = u[p * dv + j] - predicted;
        }
      }
      for (int64_t p = 0; p < n; ++p) {
        float* out = r.out + ((first + p) * s.heads + h) * dv;
        for (int64_t j = 0; j < dv; ++j) {
          double o = 0;
          for (int64_t i = 0; i < dk; ++i) o += q[p * dk + i] * std::exp(gc[p * dk + i]) * S[i * dv + j];
          for (int64_t b = 0; b <= p; ++b) {
            double score = 0;
            for (int64_t i = 0; i < dk; ++i) score += q[p * dk + i] * k[b * dk + i] * std::exp(gc[p * dk + i] - gc[b * dk + i]);
            o += score * vnew[b * dv + j];
          }
          out[j] = static_cast<float>(o);
        }
      }
      // The state after the chunk: decayed over the whole chunk, plus each position's key
      // (decayed from its position to the chunk's end) times its corrected value.
      for (int64_t i = 0; i < dk; ++i) {
        const double last = gc[(n - 1) * dk + i];
        for (int64_t j = 0; j < dv; ++j) {
          double sum = S[i * dv + j] * std::exp(last);
          for (int64_t b = 0; b < n; ++b) sum += k[b * dk + i] * std::exp(last - gc[b * dk + i]) * vnew[b * dv + j];
          S[i * dv + j] = sum;
        }
      }
    }
    for (int64_t e = 0; e < dk * dv; ++e) head_state[e] = static_cast<float>(S[e]);
  }
}

void delta_rule_log_decay(const float* f, int64_t tokens, const DeltaRuleShape& s, const float* a_log,
                          const float* dt_bias, const float* lower_bound, float* g) {
  const int64_t width = s.heads * s.key_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < width; ++c) {
      const double rate = std::exp(static_cast<double>(a_log[c / s.key_dim]));
      const double x = static_cast<double>(f[t * width + c]) + dt_bias[c];
      double decay;
      if (lower_bound != nullptr) {
        decay = *lower_bound / (1.0 + std::exp(-rate * x));
      } else {
        decay = -rate * (x > 20.0 ? x : std::log1p(std::exp(x)));
      }
      g[t * width + c] = static_cast<float>(decay);
    }
  }
}

void gated_rms_norm_heads(const float* x, const float* gate, const float* weight, int64_t rows, int64_t heads,
                          int64_t dv, float eps, float* y) {
  for (int64_t r = 0; r < rows * heads; ++r) {
    const float* xr = x + r * dv;
    const float* gr = gate + r * dv;
    double sum = 0;
    for (int64_t j = 0; j < dv; ++j) sum += static_cast<double>(xr[j]) * xr[j];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(dv) + eps);
    float* yr = y + r * dv;
    for (int64_t j = 0; j < dv; ++j) {
      const double sig = 1.0 / (1.0 + std::exp(-static_cast<double>(gr[j])));
      yr[j] = static_cast<float>(xr[j] * inv * weight[j] * sig);
    }
  }
}

namespace cpu {

void gated_delta_rule_step(backend::Context& ctx, int64_t heads, int64_t dim, const DeltaRuleStepRows& rows,
                           const DeltaRuleHeadWeights& w, const StepView& step, float* state, float* out) {
  const int64_t width = heads * dim;
  const DeltaRuleShape shape{heads, dim, dim};
  R3_CHECK(rows.qkv_stride >= width, "delta rule: rows of ", rows.qkv_stride, " floats for ", heads, " x ", dim);
  backend::Workspace::Scope scope(ctx.workspace());
  const std::span<float> q = ctx.workspace().array<float>(step.tokens * width);
  const std::span<float> k = ctx.workspace().array<float>(step.tokens * width);
  const std::span<float> v = ctx.workspace().array<float>(step.tokens * width);
  const std::span<float> g = ctx.workspace().array<float>(step.tokens * width);
  const std::span<float> beta = ctx.workspace().array<float>(step.tokens * heads);
  for (int64_t t = 0; t < step.tokens; ++t) {
    if (step.seqs[t] < 0) std::fill(out + t * width, out + (t + 1) * width, 0.0f);  // a padding row
  }
  for_each_sequence_run(step, [&](int32_t seq, int64_t first, int64_t end) {
    const int64_t n = end - first;
    const auto row_bytes = sizeof(float) * static_cast<std::size_t>(width);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(q.data() + t * width, rows.q + (first + t) * rows.qkv_stride, row_bytes);
      std::memcpy(k.data() + t * width, rows.k + (first + t) * rows.qkv_stride, row_bytes);
      std::memcpy(v.data() + t * width, rows.v + (first + t) * rows.qkv_stride, row_bytes);
    }
    delta_rule_log_decay(rows.f + first * width, n, shape, w.a_log, w.dt_bias, w.bounded ? &w.lower_bound : nullptr,
                         g.data());
    for (int64_t i = 0; i < n * heads; ++i) {
      beta[static_cast<std::size_t>(i)] =
          static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(rows.beta[first * heads + i]))));
    }
    float* core = out + first * width;
    delta_rule_recurrent(shape, {q.data(), k.data(), v.data(), g.data(), beta.data(), n, core},
                         state + seq * heads * dim * dim);
    gated_rms_norm_heads(core, rows.gate + first * width, w.norm, n, heads, dim, w.eps, core);
  });
}

}  // namespace cpu

}  // namespace r3::ops
