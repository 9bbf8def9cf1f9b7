#include "moe/expert_kernels.h"

#include <algorithm>
#include <cstring>

#include "ops/activation.h"
#include "ops/dot.h"
#include "ops/linear.h"

namespace r3::moe {

namespace {


void check_shapes(const Tensor& hidden, const PhysicalRouting& routing, const PhysicalExperts& experts,
                  const Tensor& out) {
  R3_CHECK(hidden.rank() == 2 && hidden.dim(1) == experts.hidden_size() && out.shape() == hidden.shape() &&
               routing.tokens == hidden.dim(0),
           "experts: shape mismatch");
}

// out[t] = sum over slots k, in order, of weight[t, k] * slot_out[t * K + k].
void combine(const PhysicalRouting& routing, const Tensor& slot_out, int64_t hidden, Tensor& out) {
  float* o = out.data<float>();
  const float* so = slot_out.data<float>();
  std::fill(o, o + routing.tokens * hidden, 0.0f);
  for (int64_t t = 0; t < routing.tokens; ++t) {
    for (int64_t j = 0; j < routing.top_k; ++j) {
      const float w = routing.weights[static_cast<std::size_t>(t * routing.top_k + j)];
      const float* row = so + (t * routing.top_k + j) * hidden;
      for (int64_t d = 0; d < hidden; ++d) o[t * hidden + d] += w * row[d];
    }
  }
}

}  // namespace

void grouped_experts(ThreadPool& pool, const Tensor& hidden, const PhysicalRouting& routing,
                     const PhysicalExperts& experts, Tensor& out) {
  check_shapes(hidden, routing, experts, out);
  const int64_t tokens = routing.tokens, k = routing.top_k, h = experts.hidden_size();
  const int64_t width = experts.intermediate_size();
  std::vector<std::vector<int64_t>> slots_of(static_cast<std::size_t>(experts.num_physical()));
  for (int64_t s = 0; s < tokens * k; ++s) {
    slots_of[static_cast<std::size_t>(routing.physical_ids[static_cast<std::size_t>(s)])].push_back(s);
  }
  Tensor slot_out = Tensor::empty(DType::F32, {tokens * k, h});
  const float* x = hidden.data<float>();
  for (int32_t e = 0; e < experts.num_physical(); ++e) {
    const auto& slots = slots_of[static_cast<std::size_t>(e)];
    const auto n = static_cast<int64_t>(slots.size());
    if (n == 0) continue;
    const SwigluExpertWeights& w = experts.weights(e);
    Tensor gathered = Tensor::empty(DType::F32, {n, h});
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(gathered.data<float>() + i * h, x + (slots[i] / k) * h, sizeof(float) * static_cast<std::size_t>(h));
    }
    Tensor gate = Tensor::empty(DType::F32, {n, width});
    Tensor up = Tensor::empty(DType::F32, {n, width});
    Tensor down = Tensor::empty(DType::F32, {n, h});
    ops::linear(pool, gathered, w.gate, w.gate_bias.if_defined(), gate);
    ops::linear(pool, gathered, w.up, w.up_bias.if_defined(), up);
    const ExpertActivation& act = experts.activation();
    for (int64_t i = 0; i < n * width; ++i) gate.data<float>()[i] = act(gate.data<float>()[i], up.data<float>()[i]);
    ops::linear(pool, gate, w.down, w.down_bias.if_defined(), down);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(slot_out.data<float>() + slots[i] * h, down.data<float>() + i * h,
                  sizeof(float) * static_cast<std::size_t>(h));
    }
  }
  combine(routing, slot_out, h, out);
}

void fused_experts(ThreadPool& pool, const Tensor& hidden, const PhysicalRouting& routing,
                   const PhysicalExperts& experts, Tensor& out) {
  check_shapes(hidden, routing, experts, out);
  const int64_t k = routing.top_k, h = experts.hidden_size(), width = experts.intermediate_size();
  Tensor slot_out = Tensor::empty(DType::F32, {routing.tokens * k, h});
  const float* x = hidden.data<float>();
  pool.parallel_for(routing.tokens * k, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> act(static_cast<std::size_t>(width));
    for (int64_t s = begin; s < end; ++s) {
      const SwigluExpertWeights& w = experts.weights(routing.physical_ids[static_cast<std::size_t>(s)]);
      const float* xt = x + (s / k) * h;
      const float* gb = w.gate_bias.defined() ? w.gate_bias.data<float>() : nullptr;
      const float* ub = w.up_bias.defined() ? w.up_bias.data<float>() : nullptr;
      const float* db = w.down_bias.defined() ? w.down_bias.data<float>() : nullptr;
      for (int64_t j = 0; j < width; ++j) {
        float g = ops::dot(xt, w.gate.data<float>() + j * h, h);
        float u = ops::dot(xt, w.up.data<float>() + j * h, h);
        if (gb) g += gb[j];
        if (ub) u += ub[j];
        act[static_cast<std::size_t>(j)] = experts.activation()(g, u);
      }
      float* y = slot_out.data<float>() + s * h;
      for (int64_t d = 0; d < h; ++d) {
        const float v = ops::dot(act.data(), w.down.data<float>() + d * width, width);
        y[d] = db ? v + db[d] : v;
      }
    }
  });
  combine(routing, slot_out, h, out);
}

}  // namespace r3::moe
