#include "ops/activation.h"

#include <cmath>

namespace r3::ops {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float silu(float x) { return x * sigmoid(x); }

void cpu::silu_and_mul(backend::Context&, const Tensor& gate, const Tensor& up, Tensor& out, float limit) {
  R3_CHECK(gate.shape() == up.shape() && gate.shape() == out.shape(), "silu_and_mul: gate ",
           shape_to_string(gate.shape()), " up ", shape_to_string(up.shape()), " out ",
           shape_to_string(out.shape()));
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] = clamped_swiglu(g[i], u[i], limit);
}

void cpu::situ_and_mul(backend::Context&, const Tensor& gate, const Tensor& up, Tensor& out, float beta,
                       float linear_beta) {
  R3_CHECK(gate.shape() == up.shape() && gate.shape() == out.shape(), "situ_and_mul: gate ",
           shape_to_string(gate.shape()), " up ", shape_to_string(up.shape()), " out ", shape_to_string(out.shape()));
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] = situ(g[i], u[i], beta, linear_beta);
}

void cpu::mul_sigmoid(backend::Context&, const Tensor& gate, Tensor& x) {
  R3_CHECK(gate.shape() == x.shape(), "mul_sigmoid: gate ", shape_to_string(gate.shape()), " x ",
           shape_to_string(x.shape()));
  const float* g = gate.data<float>();
  float* v = x.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) v[i] *= sigmoid(g[i]);
}

}  // namespace r3::ops
