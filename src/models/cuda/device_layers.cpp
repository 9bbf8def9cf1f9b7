// The MoE layers of a decoder on the device, which still have a device copy of their own
// (models/cuda/device_decoder_parts.h): MoeFeedForward's step with each piece replaced by its
// device kernel and the per-token metadata read from the step's one upload.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <span>
#include <vector>

#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "core/dtype.h"
#include "models/cuda/device_decoder_parts.h"
#include "moe/device_ep_dispatch.h"
#include "moe/ep/device_expert_moves.h"
#include "moe/ep/expert_moves.h"
#include "ops/linear.h"

namespace r3::models::device {

namespace {
// Norms, biases, sinks, gates: always float32.
Tensor f32_on_device(backend::Context& ctx, const Tensor& host) { return on_device(ctx, host, DType::F32); }
}  // namespace

Moe::Moe(backend::Context& ctx, const MoeFeedForward& host, DType weights_dtype, bool eplb, moe::ExpertSlice slice)
    : Moe(ctx, host.moe(), weights_dtype, eplb, slice) {
  if (host.shared_expert()) shared_expert.emplace(mlp_on_device(ctx, *host.shared_expert(), dtype));
  shared_gate = f32_on_device(ctx, host.shared_gate());
}

Moe::Moe(backend::Context& ctx, const moe::MoeBlock& block, DType weights_dtype, bool eplb, moe::ExpertSlice slice)
    : layer_id(block.layer_id()), dtype(weights_dtype) {
  const moe::PhysicalExperts& physical = block.experts();
  const moe::MoeBlock::Gate gate = block.gate();
  num_experts = gate.weight.dim(0);
  top_k = gate.rule.top_k();
  R3_CHECK(num_experts <= moe::kMaxDeviceExperts, "--device cuda: MoE layer ", layer_id, " has ", num_experts,
           " experts; the routing kernel takes at most ", moe::kMaxDeviceExperts);
  moe::DeviceRuleDescription described = moe::describe_for_device(gate.rule);
  rule = described.rule;
  if (!described.bias.empty()) {
    correction_bias =
        backend::to_device(ctx, Tensor::from(described.bias, {static_cast<int64_t>(described.bias.size())}));
    rule.bias = correction_bias.data<float>();
  }
  gate_weight = f32_on_device(ctx, gate.weight);
  gate_bias = f32_on_device(ctx, gate.bias);
  experts = moe::upload_experts(ctx, physical, dtype, slice);
  physical_experts = physical.num_physical();
  host_experts = &physical;
  placement_version = physical.placement_version();
  if (eplb) {
    map = std::make_shared<moe::DeviceExpertMap>(ctx, physical.placement());
    held_placement = physical.placement();
  }
  monolithic_sync = std::make_shared<moe::MonolithicMoeSync>(ctx);
}

moe::DeviceCapturedRouting Moe::route(backend::Context& ctx, const Tensor& x, const ops::StepView& step,
                                      int32_t* ids, float* weights, moe::DeviceCaptureRows capture) const {
  const int64_t tokens = x.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor logits = ctx.scratch_for_output(DType::F32, {tokens, num_experts});  // written in full by the GEMM
  ops::linear(ctx, x, gate_weight, gate_bias.if_defined(), logits);
  const int32_t* forced = step.forced != nullptr ? step.forced + layer_id * tokens * top_k : nullptr;
  return moe::route_on_device(ctx, logits, rule, forced, step.replayed, ids, weights, capture);
}

moe::DevicePhysicalRouting Moe::physical_routing(backend::Context& ctx, const ops::StepView& step,
                                                 const moe::DeviceCapturedRouting& captured,
                                                 int32_t* load_counts) const {
  if (!map && !host_map()) return moe::DevicePhysicalRouting::without_replicas(captured);
  int32_t* physical = ctx.scratch_for_output(DType::I32, {captured.tokens(), top_k}).data<int32_t>();
  if (host_map()) return moe::map_on_host(ctx, *host_experts, captured, physical);
  return map->map(ctx, captured, step.seqs, physical, load_counts);
}

void Moe::run_experts(backend::Context& ctx, const Tensor& x, const ops::StepView& step,
                      const moe::DeviceCapturedRouting& captured, int32_t* load_counts, Tensor& out,
                      bool always_grouped) const {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), pairs = tokens * top_k;
  backend::Workspace::Scope scope(ctx.workspace());
  // Every buffer here is written in full by the kernel that fills it (the grouping's unused tail
  // is never read): no fills.
  const moe::DevicePhysicalRouting physical = physical_routing(ctx, step, captured, load_counts);
  Tensor grouping = ctx.scratch_for_output(DType::I32, {moe::grouping_ints(experts.gate.dim(0), pairs)});
  Tensor activated = ctx.scratch_for_output(DType::F32, {moe::expert_scratch_rows(pairs), experts.gate.dim(1)});
  Tensor expert_out = ctx.scratch_for_output(DType::F32, {moe::expert_scratch_rows(pairs), hidden});
  moe::fused_experts_on_device(ctx, x, physical, experts, grouping, activated, expert_out, out, always_grouped);
  if (shared_expert) add_shared_expert(ctx, x, *shared_expert, shared_gate, out);
}

void Moe::run_experts_over_gpus(backend::Context& ctx, const Tensor& x, const ops::StepView& step,
                                const moe::DeviceCapturedRouting& captured, int32_t* load_counts,
                                const moe::ep::ExpertParallelDispatcher& ep, const int32_t* owner_of,
                                Tensor& out) const {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), pairs = tokens * top_k;
  moe::ep::DeviceExchange& exchange = *ep.device_exchange();
  const int ranks = exchange.size();
  const auto n = static_cast<std::size_t>(ranks);
  // The experts this rank owns must be among those it holds (all of them, or its slice).
  const std::vector<int32_t>& owners = ep.owner_of();
  const auto mine = [&](int32_t p) { return owners[static_cast<std::size_t>(p)] == exchange.rank(); };
  for (int32_t p = 0; p < static_cast<int32_t>(owners.size()); ++p) {
    R3_CHECK(!mine(p) || (p >= experts.first && p < experts.first + experts.gate.dim(0)), "expert parallelism: rank ",
             exchange.rank(), " owns physical expert ", p, " of MoE layer ", layer_id, " but holds experts ",
             experts.first, " to ", experts.first + experts.gate.dim(0) - 1);
  }
  backend::Workspace::Scope scope(ctx.workspace());
  const moe::DevicePhysicalRouting physical = physical_routing(ctx, step, captured, load_counts);
  const int32_t* expert_ids = physical.ids();
  const float* weights = physical.weights();
  // The plan, and every rank's count for every other (4 bytes each way).
  Tensor plan = ctx.scratch_for_output(DType::I32, {3 * ranks + pairs});  // counts, offsets, came, pair_slot
  int32_t* counts = plan.data<int32_t>();
  int32_t* offsets = counts + ranks;
  int32_t* came = offsets + ranks;
  int32_t* pair_slot = came + ranks;
  moe::plan_expert_parallel_slots(ctx, expert_ids, pairs, owner_of, ranks, counts, offsets, pair_slot);
  std::vector<int64_t> word_offsets(n), words(n, sizeof(int32_t));
  for (std::size_t r = 0; r < n; ++r) word_offsets[r] = static_cast<int64_t>(r * sizeof(int32_t));
  exchange.all_to_all(ctx, reinterpret_cast<const std::byte*>(counts), word_offsets, words,
                      reinterpret_cast<std::byte*>(came), word_offsets, words);
  // The layer's one wait: the sizes of the exchanges that follow.
  std::vector<int32_t> sent(n), received(n);
  R3_CUDA_CHECK(cudaStreamSynchronize(ctx.cuda_state().stream));
  R3_CUDA_CHECK(cudaMemcpy(sent.data(), counts, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  R3_CUDA_CHECK(cudaMemcpy(received.data(), came, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  // Byte runs of rows (and of ids) per rank, in rank order: what goes out, what comes in.
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> send_at(n), send_rows(n), recv_at(n), recv_rows(n);
  int64_t sent_total = 0, came_total = 0;
  for (std::size_t r = 0; r < n; ++r) {
    send_at[r] = sent_total;
    send_rows[r] = sent[r];
    sent_total += sent[r];
    recv_at[r] = came_total;
    recv_rows[r] = received[r];
    came_total += received[r];
  }
  R3_CHECK(sent_total == pairs, "expert parallelism (cuda): planned ", sent_total, " of ", pairs, " pairs");
  ep.count_rows_sent_elsewhere(pairs - sent[static_cast<std::size_t>(exchange.rank())]);
  const auto scaled = [](std::vector<int64_t> v, int64_t by) {
    for (int64_t& value : v) value *= by;
    return v;
  };
  Tensor send = ctx.scratch_for_output(DType::F32, {pairs, hidden});
  Tensor send_ids = ctx.scratch_for_output(DType::I32, {pairs});
  moe::pack_expert_parallel_rows(ctx, x, top_k, expert_ids, owner_of, offsets, pair_slot, send, send_ids.data<int32_t>());
  Tensor arrived = ctx.scratch_for_output(DType::F32, {came_total, hidden});
  Tensor arrived_ids = ctx.scratch_for_output(DType::I32, {came_total});
  const auto bytes = [](Tensor& t) { return static_cast<std::byte*>(t.raw_data()); };
  exchange.all_to_all(ctx, bytes(send), scaled(send_at, row_bytes), scaled(send_rows, row_bytes), bytes(arrived),
                      scaled(recv_at, row_bytes), scaled(recv_rows, row_bytes));
  exchange.all_to_all(ctx, bytes(send_ids), scaled(send_at, 4), scaled(send_rows, 4), bytes(arrived_ids),
                      scaled(recv_at, 4), scaled(recv_rows, 4));
  // This rank's experts over what came, and each row back to its rank, in the slot it left from.
  Tensor outputs = ctx.scratch_for_output(DType::F32, {came_total, hidden});
  moe::rows_through_their_experts_on_device(ctx, arrived, arrived_ids.data<int32_t>(), experts, outputs);
  Tensor back = ctx.scratch_for_output(DType::F32, {pairs, hidden});
  exchange.all_to_all(ctx, bytes(outputs), scaled(recv_at, row_bytes), scaled(recv_rows, row_bytes), bytes(back),
                      scaled(send_at, row_bytes), scaled(send_rows, row_bytes));
  moe::combine_expert_parallel_rows(ctx, back, expert_ids, weights, top_k, owner_of, offsets, pair_slot, out);
  if (shared_expert) add_shared_expert(ctx, x, *shared_expert, shared_gate, out);
}

void Moe::route_and_run_experts(backend::Context& ctx, const Tensor& x, const ops::StepView& step, int32_t* ids,
                                float* weights, moe::DeviceCaptureRows capture, int32_t* load_counts, Tensor& out,
                                const Tensor* experts_x) const {
  const int64_t tokens = x.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor scratch =
      ctx.scratch_for_output(DType::F32, {moe::monolithic_moe_scratch_floats(experts, tokens, num_experts, top_k)});
  moe::MonolithicMoeStep s;
  s.hidden = &x;
  s.router = &gate_weight;
  s.router_bias = gate_bias.if_defined();
  s.experts_input = experts_x;
  s.rule = rule;
  s.forced = step.forced != nullptr ? step.forced + layer_id * tokens * top_k : nullptr;
  s.replayed = step.replayed;
  s.capture = capture;
  if (map) s.map = {map->offsets(), map->replicas(), step.seqs, load_counts};
  s.ids = ids;
  s.weights = weights;
  moe::monolithic_moe_on_device(ctx, s, experts, *monolithic_sync, scratch, out);
  if (shared_expert) add_shared_expert(ctx, experts_x != nullptr ? *experts_x : x, *shared_expert, shared_gate, out);
}

void Moe::follow_placement(backend::Context& ctx, const moe::ep::ExpertParallelDispatcher* ep) const {
  if (!map || host_experts->placement_version() == placement_version) return;
  const moe::ExpertPlacement& to = host_experts->placement();
  // One rank holds every slot; expert-parallel ranks, the dispatcher's slices.
  const std::vector<int32_t> one_rank(ep == nullptr ? static_cast<std::size_t>(to.num_physical()) : 0, 0);
  const std::span<const int32_t> owners = ep != nullptr ? std::span<const int32_t>(ep->owner_of()) : one_rank;
  const std::vector<moe::ep::ExpertMove> moves = moe::ep::plan_expert_moves(*held_placement, to, owners);
  moe::ep::move_device_experts(ctx, experts, moves, owners, ep != nullptr ? ep->device_exchange() : nullptr);
  map->update(to);
  held_placement = to;
  placement_version = host_experts->placement_version();
}

}  // namespace r3::models::device
