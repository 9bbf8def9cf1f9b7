#include "moe/expert_kernels.h"

#include <algorithm>
#include <cstring>

#include "ops/activation.h"
#include "ops/linear.h"
#include "ops/matmul.h"

namespace r3::moe {

namespace {


void check_shapes(const Tensor& hidden, const PhysicalRouting& routing, const PhysicalExperts& experts,
                  const Tensor& out) {
  R3_CHECK(hidden.rank() == 2 && hidden.dim(1) == experts.hidden_size() && out.shape() == hidden.shape() &&
               routing.tokens == hidden.dim(0),
           "experts: shape mismatch");
}

// out[t] = sum over choices k, in order, of weight[t, k] * choice_out[t * K + k].
void combine(const PhysicalRouting& routing, const Tensor& choice_out, int64_t hidden, Tensor& out) {
  float* o = out.data<float>();
  const float* so = choice_out.data<float>();
  std::fill(o, o + routing.tokens * hidden, 0.0f);
  for (int64_t t = 0; t < routing.tokens; ++t) {
    for (int64_t j = 0; j < routing.top_k; ++j) {
      const float w = routing.weights[static_cast<std::size_t>(t * routing.top_k + j)];
      const float* row = so + (t * routing.top_k + j) * hidden;
      for (int64_t d = 0; d < hidden; ++d) o[t * hidden + d] += w * row[d];
    }
  }
}

// Scratch for the fused kernel's per-step buffers, reused across calls (it grows, never shrinks):
// fresh multi-megabyte buffers each layer went back to the kernel and were faulted in and zeroed
// again every time (about 5% of a prefill). The backend layer's planned workspaces will replace it.
// Output rows of one expert task. Long runs of one matrix keep the hardware prefetchers streaming
// (128 rows beat 16 by about 10% at batch 1 on the benchmark model) while a decode step still has
// dozens of tasks per layer for the threads to share.
constexpr int64_t kPanel = 128;

float* fused_scratch(std::size_t floats) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < floats) scratch.resize(floats);
  return scratch.data();
}

}  // namespace

void grouped_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                     const PhysicalExperts& experts, Tensor& out) {
  check_shapes(hidden, routing, experts, out);
  const int64_t tokens = routing.tokens, k = routing.top_k, h = experts.hidden_size();
  const int64_t width = experts.intermediate_size();
  std::vector<std::vector<int64_t>> pairs_of(static_cast<std::size_t>(experts.num_physical()));
  for (int64_t s = 0; s < tokens * k; ++s) {
    pairs_of[static_cast<std::size_t>(routing.physical_ids[static_cast<std::size_t>(s)])].push_back(s);
  }
  Tensor choice_out = Tensor::empty(DType::F32, {tokens * k, h});
  const float* x = hidden.data<float>();
  for (int32_t e = 0; e < experts.num_physical(); ++e) {
    const auto& pairs = pairs_of[static_cast<std::size_t>(e)];
    const auto n = static_cast<int64_t>(pairs.size());
    if (n == 0) continue;
    const SwigluExpertWeights& w = experts.weights(e);
    Tensor gathered = Tensor::empty(DType::F32, {n, h});
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(gathered.data<float>() + i * h, x + (pairs[i] / k) * h, sizeof(float) * static_cast<std::size_t>(h));
    }
    Tensor gate = Tensor::empty(DType::F32, {n, width});
    Tensor up = Tensor::empty(DType::F32, {n, width});
    Tensor down = Tensor::empty(DType::F32, {n, h});
    ops::linear(ctx, gathered, w.gate, w.gate_bias.if_defined(), gate);
    ops::linear(ctx, gathered, w.up, w.up_bias.if_defined(), up);
    const ExpertActivation& act = experts.activation();
    for (int64_t i = 0; i < n * width; ++i) gate.data<float>()[i] = act(gate.data<float>()[i], up.data<float>()[i]);
    ops::linear(ctx, gate, w.down, w.down_bias.if_defined(), down);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(choice_out.data<float>() + pairs[i] * h, down.data<float>() + i * h,
                  sizeof(float) * static_cast<std::size_t>(h));
    }
  }
  combine(routing, choice_out, h, out);
}

void fused_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                   const PhysicalExperts& experts, Tensor& out) {
  check_shapes(hidden, routing, experts, out);
  const int64_t pairs = routing.tokens * routing.top_k, h = experts.hidden_size();
  const int64_t width = experts.intermediate_size();
  // Dispatch: (token, choice) pairs sorted by physical expert (a counting sort keeps each expert's
  // pairs in (token, choice) order), their hidden rows gathered, so every expert multiplies all its
  // rows at once and reads its weights once per step, however many tokens chose it.
  std::vector<int64_t> group_start(static_cast<std::size_t>(experts.num_physical()) + 1, 0);
  for (int32_t e : routing.physical_ids) ++group_start[static_cast<std::size_t>(e) + 1];
  for (std::size_t e = 1; e < group_start.size(); ++e) group_start[e] += group_start[e - 1];
  std::vector<int64_t> row_of_pair(static_cast<std::size_t>(pairs));
  {
    std::vector<int64_t> next(group_start.begin(), group_start.end() - 1);
    for (int64_t s = 0; s < pairs; ++s) {
      row_of_pair[static_cast<std::size_t>(s)] = next[static_cast<std::size_t>(routing.physical_ids[static_cast<std::size_t>(s)])]++;
    }
  }
  float* scratch = fused_scratch(static_cast<std::size_t>(pairs * (2 * h + width)));
  Tensor gathered = Tensor::view(DType::F32, {pairs, h}, scratch, nullptr);
  Tensor activated = Tensor::view(DType::F32, {pairs, width}, scratch + pairs * h, nullptr);
  Tensor pair_out = Tensor::view(DType::F32, {pairs, h}, scratch + pairs * (h + width), nullptr);
  const float* x = hidden.data<float>();
  for (int64_t s = 0; s < pairs; ++s) {
    std::memcpy(gathered.data<float>() + row_of_pair[static_cast<std::size_t>(s)] * h, x + (s / routing.top_k) * h,
                sizeof(float) * static_cast<std::size_t>(h));
  }
  // Work items: (expert group, panel of output rows), for both GEMMs.
  std::vector<std::pair<int32_t, int64_t>> gate_tasks, down_tasks;
  for (int32_t e = 0; e < experts.num_physical(); ++e) {
    if (group_start[static_cast<std::size_t>(e) + 1] == group_start[static_cast<std::size_t>(e)]) continue;
    for (int64_t p = 0; p < width; p += kPanel) gate_tasks.emplace_back(e, p);
    for (int64_t p = 0; p < h; p += kPanel) down_tasks.emplace_back(e, p);
  }
  auto bias_of = [](const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; };
  // Gate and up projections and the activation, panel by panel.
  ctx.parallel_for(static_cast<int64_t>(gate_tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> gate, up;
    for (int64_t task = begin; task < end; ++task) {
      const auto [e, p0] = gate_tasks[static_cast<std::size_t>(task)];
      const SwigluExpertWeights& w = experts.weights(e);
      const int64_t row0 = group_start[static_cast<std::size_t>(e)];
      const int64_t rows = group_start[static_cast<std::size_t>(e) + 1] - row0;
      const int64_t p1 = std::min(width, p0 + kPanel), cols = p1 - p0;
      gate.resize(static_cast<std::size_t>(rows * cols));
      up.resize(gate.size());
      const float* xe = gathered.data<float>() + row0 * h;
      ops::matmul_rows(xe, rows, h, ops::WeightMatrix::of(w.gate), p0, p1, bias_of(w.gate_bias), gate.data(), cols);
      ops::matmul_rows(xe, rows, h, ops::WeightMatrix::of(w.up), p0, p1, bias_of(w.up_bias), up.data(), cols);
      for (int64_t r = 0; r < rows; ++r) {
        float* a = activated.data<float>() + (row0 + r) * width + p0;
        for (int64_t c = 0; c < cols; ++c) {
          a[c] = experts.activation()(gate[static_cast<std::size_t>(r * cols + c)], up[static_cast<std::size_t>(r * cols + c)]);
        }
      }
    }
  });
  // Down projection into one output row per pair.
  ctx.parallel_for(static_cast<int64_t>(down_tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const auto [e, p0] = down_tasks[static_cast<std::size_t>(task)];
      const SwigluExpertWeights& w = experts.weights(e);
      const int64_t row0 = group_start[static_cast<std::size_t>(e)];
      const int64_t rows = group_start[static_cast<std::size_t>(e) + 1] - row0;
      ops::matmul_rows(activated.data<float>() + row0 * width, rows, width, ops::WeightMatrix::of(w.down), p0,
                       std::min(h, p0 + kPanel), bias_of(w.down_bias),
                       pair_out.data<float>() + row0 * h + p0, h);
    }
  });
  // Combine in (token, choice) order, reading each pair's row where the dispatch put it.
  float* o = out.data<float>();
  std::fill(o, o + routing.tokens * h, 0.0f);
  for (int64_t s = 0; s < pairs; ++s) {
    const float w = routing.weights[static_cast<std::size_t>(s)];
    const float* row = pair_out.data<float>() + row_of_pair[static_cast<std::size_t>(s)] * h;
    float* ot = o + (s / routing.top_k) * h;
    for (int64_t d = 0; d < h; ++d) ot[d] += w * row[d];
  }
}

}  // namespace r3::moe
