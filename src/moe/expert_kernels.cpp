#include "moe/expert_kernels.h"

#include <algorithm>

#include "ops/matmul.h"

namespace r3::moe {

namespace {

void check_shapes(const Tensor& hidden, const PhysicalRouting& routing, const PhysicalExperts& experts,
                  const Tensor& out) {
  R3_CHECK(hidden.rank() == 2 && hidden.dim(1) == experts.hidden_size() && out.shape() == hidden.shape() &&
               routing.tokens == hidden.dim(0),
           "experts: shape mismatch");
}

// Output rows of one expert task. Long runs of one matrix keep the hardware prefetchers streaming
// while a decode step still has dozens of tasks per layer for the threads to share.
constexpr int64_t kPanel = 128;

// gate/up rows [row0, row0 + rows) x output channels [p0, p1) of expert e, activated into
// `activated` [pairs, width]; gate and up are scratch of rows * (p1 - p0) floats each.
void gate_up_panel(const ExpertBank& bank, const ExpertActivation& act, int32_t e, const float* x, int64_t h,
                   int64_t rows, int64_t p0, int64_t p1, float* gate, float* up, float* activated, int64_t width) {
  const int64_t cols = p1 - p0;
  ops::matmul_rows(x, rows, h, bank.gate[static_cast<std::size_t>(e)], p0, p1, bank.gate_bias[static_cast<std::size_t>(e)], gate, cols);
  ops::matmul_rows(x, rows, h, bank.up[static_cast<std::size_t>(e)], p0, p1, bank.up_bias[static_cast<std::size_t>(e)], up, cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* a = activated + r * width + p0;
    for (int64_t c = 0; c < cols; ++c) a[c] = act(gate[r * cols + c], up[r * cols + c]);
  }
}

// What both kernels start from, in the step workspace (inside the caller's scope): the pairs
// dispatched by physical expert, and buffers for their activations and outputs.
struct ExpertsStep {
  ExpertsStep(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
              const PhysicalExperts& experts, const Dispatcher& dispatcher)
      : h(experts.hidden_size()),
        width(experts.intermediate_size()),
        d(dispatcher.dispatch(ctx, hidden, routing, experts.num_physical())),
        pairs(d.rows.dim(0)),
        activated(ctx.scratch(DType::F32, {pairs, width})),
        expert_out(ctx.scratch(DType::F32, {pairs, h})) {}

  int64_t h, width;
  Dispatch d;
  int64_t pairs;
  Tensor activated;   // [pairs, width]
  Tensor expert_out;  // [pairs, h]
};

}  // namespace

void grouped_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                     const PhysicalExperts& experts, Tensor& out, const Dispatcher& dispatcher) {
  check_shapes(hidden, routing, experts, out);
  backend::Workspace::Scope scope(ctx.workspace());
  ExpertsStep step(ctx, hidden, routing, experts, dispatcher);
  const int64_t h = step.h, width = step.width;
  const Dispatch& d = step.d;
  const ExpertBank& bank = experts.bank();
  auto gate_up = ctx.per_thread<float>(2 * kPanel * step.pairs);
  for (int32_t e = 0; e < experts.num_physical(); ++e) {
    const int64_t rows = d.group_rows(e), row0 = d.group_start[static_cast<std::size_t>(e)];
    if (rows == 0) continue;
    const float* x = d.rows.data<float>() + row0 * h;
    float* a = step.activated.data<float>() + row0 * width;
    const int64_t gate_panels = (width + kPanel - 1) / kPanel;
    ctx.parallel_for(gate_panels, 1, [&](int64_t begin, int64_t end) {
      const std::span<float> scratch = gate_up.mine();
      for (int64_t panel = begin; panel < end; ++panel) {
        const int64_t p0 = panel * kPanel, p1 = std::min(width, p0 + kPanel);
        gate_up_panel(bank, experts.activation(), e, x, h, rows, p0, p1, scratch.data(),
                      scratch.data() + rows * kPanel, a, width);
      }
    });
    const int64_t down_panels = (h + ops::kMatmulPanelRows - 1) / ops::kMatmulPanelRows;
    ctx.parallel_for(down_panels, 1, [&](int64_t begin, int64_t end) {
      const int64_t n0 = begin * ops::kMatmulPanelRows, n1 = std::min(h, end * ops::kMatmulPanelRows);
      ops::matmul_rows(a, rows, width, bank.down[static_cast<std::size_t>(e)], n0, n1,
                       bank.down_bias[static_cast<std::size_t>(e)], step.expert_out.data<float>() + row0 * h + n0, h);
    });
  }
  dispatcher.combine(ctx, d, step.expert_out, routing, out);
}

void fused_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                   const PhysicalExperts& experts, Tensor& out, const Dispatcher& dispatcher) {
  check_shapes(hidden, routing, experts, out);
  backend::Workspace::Scope scope(ctx.workspace());
  // Dispatch: every expert multiplies all its rows at once and reads its weights once per step,
  // however many tokens chose it.
  ExpertsStep step(ctx, hidden, routing, experts, dispatcher);
  const int64_t h = step.h, width = step.width, pairs = step.pairs;
  const Dispatch& d = step.d;
  Tensor& activated = step.activated;
  Tensor& expert_out = step.expert_out;
  const ExpertBank& bank = experts.bank();
  // Work items: (expert, panel of output rows), for both GEMMs.
  const int64_t gate_panels = (width + kPanel - 1) / kPanel, down_panels = (h + kPanel - 1) / kPanel;
  int64_t used = 0;
  for (int32_t e = 0; e < experts.num_physical(); ++e) used += d.group_rows(e) > 0 ? 1 : 0;
  const std::span<int32_t> used_experts = ctx.workspace().array<int32_t>(used);
  for (int32_t e = 0, i = 0; e < experts.num_physical(); ++e) {
    if (d.group_rows(e) > 0) used_experts[static_cast<std::size_t>(i++)] = e;
  }
  auto gate_up = ctx.per_thread<float>(2 * kPanel * pairs);
  // Gate and up projections and the activation, panel by panel.
  ctx.parallel_for(used * gate_panels, 1, [&](int64_t begin, int64_t end) {
    const std::span<float> scratch = gate_up.mine();
    for (int64_t task = begin; task < end; ++task) {
      const int32_t e = used_experts[static_cast<std::size_t>(task / gate_panels)];
      const int64_t p0 = task % gate_panels * kPanel, p1 = std::min(width, p0 + kPanel);
      const int64_t row0 = d.group_start[static_cast<std::size_t>(e)], rows = d.group_rows(e);
      gate_up_panel(bank, experts.activation(), e, d.rows.data<float>() + row0 * h, h, rows, p0, p1,
                    scratch.data(), scratch.data() + rows * kPanel, activated.data<float>() + row0 * width, width);
    }
  });
  // Down projection into one output row per pair.
  ctx.parallel_for(used * down_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int32_t e = used_experts[static_cast<std::size_t>(task / down_panels)];
      const int64_t p0 = task % down_panels * kPanel;
      const int64_t row0 = d.group_start[static_cast<std::size_t>(e)], rows = d.group_rows(e);
      ops::matmul_rows(activated.data<float>() + row0 * width, rows, width, bank.down[static_cast<std::size_t>(e)], p0,
                       std::min(h, p0 + kPanel), bank.down_bias[static_cast<std::size_t>(e)],
                       expert_out.data<float>() + row0 * h + p0, h);
    }
  });
  dispatcher.combine(ctx, d, expert_out, routing, out);
}

}  // namespace r3::moe
