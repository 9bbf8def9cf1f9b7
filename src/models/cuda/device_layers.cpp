// The layers of a decoder on the device (models/cuda/device_decoder_parts.h): the host layers'
// steps (GqaAttention::forward, SwigluMlp::forward, MoeFeedForward::forward) with each piece
// replaced by its device kernel and the per-token metadata read from the step's one upload.
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
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cuda/l2_prefetch.h"
#include "ops/kv_write.h"
#include "ops/latent_attention.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models::device {

namespace {
// Norms, biases, sinks, gates: always float32.
Tensor f32_on_device(backend::Context& ctx, const Tensor& host) { return on_device(ctx, host, DType::F32); }

// A weight published quantized (FP8 with block scales, MXFP4): placed as stored, never widened.
bool stored_quantized(const Tensor& w) { return w.block_scales() != nullptr || w.mx_scales() != nullptr; }

// Host tensors of one width stacked as the rows of one float32 host tensor (each widened exactly).
Tensor stacked_rows(std::initializer_list<const Tensor*> parts) {
  const int64_t cols = (*parts.begin())->rank() == 1 ? 1 : (*parts.begin())->shape().back();
  int64_t rows = 0;
  for (const Tensor* t : parts) rows += t->numel() / cols;
  Tensor out = Tensor::empty(DType::F32, cols == 1 ? Shape{rows} : Shape{rows, cols});
  float* dst = out.data<float>();
  for (const Tensor* t : parts) {
    R3_CHECK(t->is_contiguous() && (t->rank() == 1 ? cols == 1 : t->shape().back() == cols),
             "stacking projections: ", shape_to_string(t->shape()), " does not have ", cols, " columns");
    R3_CHECK(!stored_quantized(*t), "stacking projections: quantized weights stay apart");
    convert_to_f32(t->raw_data(), t->dtype(), static_cast<std::size_t>(t->numel()), dst);
    dst += t->numel();
  }
  return out;
}

// FP8 q, k and v stacked as one FP8 matrix with their scale rows stacked alike, possible when each
// starts and ends on a block-row boundary (Qwen3-30B-A3B-FP8: 4096 + 512 + 512 rows in blocks of
// 128), so that one scale grid serves all three; an undefined tensor otherwise (they then run as
// three projections).
Tensor stacked_fp8_rows(std::initializer_list<const Tensor*> parts) {
  const BlockScales* s0 = (*parts.begin())->block_scales();
  if (s0 == nullptr) return Tensor();
  const int64_t cols = (*parts.begin())->dim(1);
  int64_t rows = 0;
  for (const Tensor* t : parts) {
    const BlockScales* s = t->block_scales();
    if (s == nullptr || t->dtype() != DType::F8_E4M3 || !t->is_contiguous() || t->dim(1) != cols ||
        s->block_rows != s0->block_rows || s->block_cols != s0->block_cols || s->first_row % s->block_rows != 0 ||
        t->dim(0) % s->block_rows != 0) {
      return Tensor();
    }
    rows += t->dim(0);
  }
  const int64_t scale_cols = s0->scales.dim(1);
  Tensor values = Tensor::empty(DType::F8_E4M3, {rows, cols});
  Tensor scales = Tensor::empty(DType::F32, {rows / s0->block_rows, scale_cols});
  auto* dst = static_cast<unsigned char*>(values.raw_data());
  float* scale_dst = scales.data<float>();
  for (const Tensor* t : parts) {
    const BlockScales* s = t->block_scales();
    std::memcpy(dst, t->raw_data(), t->nbytes());
    dst += t->nbytes();
    const int64_t scale_rows = t->dim(0) / s->block_rows;
    std::memcpy(scale_dst, s->scales.data<float>() + (s->first_row / s->block_rows) * scale_cols,
                sizeof(float) * static_cast<std::size_t>(scale_rows * scale_cols));
    scale_dst += scale_rows * scale_cols;
  }
  BlockScales stacked;
  stacked.scales = std::move(scales);
  stacked.block_rows = s0->block_rows;
  stacked.block_cols = s0->block_cols;
  return values.with_block_scales(std::move(stacked));
}
}  // namespace

Tensor on_device(backend::Context& ctx, const Tensor& host, DType dtype) {
  return host.defined() ? backend::to_device_as(ctx, host, dtype) : Tensor();
}

Tensor stacked_on_device(backend::Context& ctx, std::initializer_list<const Tensor*> parts, DType dtype) {
  bool quantized = false;
  for (const Tensor* t : parts) quantized = quantized || stored_quantized(*t);
  if (!quantized) return on_device(ctx, stacked_rows(parts), dtype);
  const Tensor fp8 = stacked_fp8_rows(parts);
  return fp8.defined() ? on_device(ctx, fp8, dtype) : Tensor();
}

SwigluMlp mlp_on_device(backend::Context& ctx, const SwigluMlp& host, DType dtype) {
  return SwigluMlp(on_device(ctx, host.gate(), dtype), on_device(ctx, host.up(), dtype),
                   on_device(ctx, host.down(), dtype), host.limit());
}

Attention::Attention(backend::Context& ctx, const GqaAttention& host, DType dtype)
    : Attention(host.spec(), host.rms_eps(), host.rotary(), host.sliding_window()) {
  const GqaAttentionWeights& h = host.weights();
  if (fuses_qkv(spec)) qkv = stacked_on_device(ctx, {&h.q, &h.k, &h.v}, dtype);
  if (qkv.defined()) {
    if (h.q_bias.defined() || h.k_bias.defined() || h.v_bias.defined()) {
      const int64_t q_width = spec.num_heads * spec.head_dim, kv_width = spec.num_kv_heads * spec.head_dim;
      const Tensor zq = Tensor::empty(DType::F32, {q_width}), zkv = Tensor::empty(DType::F32, {kv_width});
      qkv_bias = f32_on_device(ctx, stacked_rows({h.q_bias.defined() ? &h.q_bias : &zq,
                                                  h.k_bias.defined() ? &h.k_bias : &zkv,
                                                  h.v_bias.defined() ? &h.v_bias : &zkv}));
    }
  } else {
    w.q = on_device(ctx, h.q, dtype);
    w.k = on_device(ctx, h.k, dtype);
    w.v = on_device(ctx, h.v, dtype);
    w.q_bias = f32_on_device(ctx, h.q_bias);
    w.k_bias = f32_on_device(ctx, h.k_bias);
    w.v_bias = f32_on_device(ctx, h.v_bias);
  }
  w.o = on_device(ctx, h.o, dtype);
  w.o_bias = f32_on_device(ctx, h.o_bias);
  w.q_norm = f32_on_device(ctx, h.q_norm);
  w.k_norm = f32_on_device(ctx, h.k_norm);
  w.sinks = f32_on_device(ctx, h.sinks);
}

void Attention::forward(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step,
                        const ops::DeviceKvPool& pool, Tensor& out) const {
  const int64_t tokens = x.dim(0), d = spec.head_dim;
  const int64_t q_width = spec.num_heads * d, kv_width = spec.num_kv_heads * d;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor qh = ctx.scratch_for_output(DType::F32, {tokens, spec.num_heads, d});  // written in full by the kernels
  // Once q/k/v has run, o's weights come into L2 beside the prepare and attention kernels
  // (ops/cuda/l2_prefetch.h).
  const bool prefetch_o = ops::cuda::o_prefetch_taken(tokens);
  if (qkv.defined()) {
    const int64_t width = q_width + 2 * kv_width;
    Tensor projected = ctx.scratch_for_output(DType::F32, {tokens, width});
    ops::linear(ctx, x, qkv, qkv_bias.if_defined(), projected);
    if (prefetch_o) ops::cuda::prefetch_into_l2_beside(ctx, w.o);
    const float* p = projected.data<float>();
    const bool norms = spec.qk_norm == QkNorm::kPerHead;
    const ops::cuda::AttentionRows rows{p,
                                        width,
                                        p + q_width,
                                        width,
                                        p + q_width + kv_width,
                                        width,
                                        norms ? w.q_norm.data<float>() : nullptr,
                                        norms ? w.k_norm.data<float>() : nullptr};
    ops::cuda::prepare_attention_rows(ctx, rotary, rows, spec.num_heads, spec.num_kv_heads, d, rms_eps, step, pool, qh);
  } else {
    // Norms over the whole projection or clipping: the host layer's projections, then the rows.
    Tensor qt = qh.reshaped({tokens, q_width});
    Tensor kt = ctx.scratch_for_output(DType::F32, {tokens, kv_width});
    Tensor vt = ctx.scratch_for_output(DType::F32, {tokens, kv_width});
    project_qkv(ctx, spec, rms_eps, w, x, qt, kt, vt);
    if (prefetch_o) ops::cuda::prefetch_into_l2_beside(ctx, w.o);
    const ops::cuda::AttentionRows rows{qt.data<float>(), q_width, kt.data<float>(), kv_width, vt.data<float>(), kv_width};
    ops::cuda::prepare_attention_rows(ctx, rotary, rows, spec.num_heads, spec.num_kv_heads, d, rms_eps, step, pool, qh);
  }
  // Written in full by attention (a padding row's zeros included). Not zero-filled: a fill is a
  // memset node in the step's graph, which breaks the chain of programmatic launches.
  Tensor attended = ctx.scratch_for_output(DType::F32, {tokens, spec.num_heads, d});
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::cuda::paged_attention(ctx, qh, step, pool, spec.num_kv_heads, scale, sliding_window,
                             w.sinks.defined() ? w.sinks.data<float>() : nullptr, attended);
  ops::linear(ctx, attended.reshaped({tokens, q_width}), w.o, w.o_bias.if_defined(), out);
}

LatentAttention::LatentAttention(backend::Context& ctx, const MlaAttention& host, DType dtype)
    : spec(host.spec()), rms_eps(host.rms_eps()), rotary(host.rotary()), softmax_scale(host.softmax_scale()) {
  const MlaWeights& h = host.weights();
  w.q_proj = on_device(ctx, h.q_proj, dtype);
  w.q_a_proj = on_device(ctx, h.q_a_proj, dtype);
  w.q_b_proj = on_device(ctx, h.q_b_proj, dtype);
  w.kv_a_proj = on_device(ctx, h.kv_a_proj, dtype);
  w.kv_b_proj = on_device(ctx, h.kv_b_proj, dtype);
  w.o_proj = on_device(ctx, h.o_proj, dtype);
  w.g_proj = on_device(ctx, h.g_proj, dtype);
  w.q_a_norm = f32_on_device(ctx, h.q_a_norm);
  w.kv_a_norm = f32_on_device(ctx, h.kv_a_norm);
  w.q_a_bias = f32_on_device(ctx, h.q_a_bias);
  w.kv_a_bias = f32_on_device(ctx, h.kv_a_bias);
  w.o_bias = f32_on_device(ctx, h.o_bias);
}

// MlaAttention::forward with the device kernels.
void LatentAttention::forward(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step,
                              const ops::DeviceKvPool& pool, Tensor& out) const {
  const LatentAttentionSpec& m = spec.latent;
  const int64_t tokens = x.dim(0), heads = spec.num_heads;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk = nope + rope, lora = m.kv_lora_rank;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor q = ctx.scratch_for_output(DType::F32, {tokens, heads * qk});
  Tensor latent = ctx.scratch_for_output(DType::F32, {tokens, lora});
  Tensor rope_key = ctx.scratch_for_output(DType::F32, {tokens, rope});
  project_mla(ctx, spec, rms_eps, w, x, q, latent, rope_key);
  Tensor rope_heads = rope_key.reshaped({tokens, 1, rope});
  Tensor q_heads = q.reshaped({tokens, heads, qk});
  ops::cuda::interleaved_rotary_on_device(ctx, rotary, rope_heads, step.positions);
  ops::cuda::interleaved_rotary_on_device(ctx, rotary, q_heads, step.positions);
  ops::cuda::write_kv_paged(ctx, latent.data<float>(), lora, rope_key.data<float>(), rope, step, pool);
  Tensor attended = ctx.scratch_for_output(DType::F32, {tokens, heads * m.v_head_dim});
  ops::cuda::latent_attention_paged(ctx, q, w.kv_b_proj, step, pool, {heads, nope, rope, m.v_head_dim, lora},
                                    softmax_scale, attended);
  if (w.g_proj.defined()) {  // Kimi K3's output gate, as MlaAttention::forward
    Tensor gate = ctx.scratch_for_output(DType::F32, {tokens, heads * m.v_head_dim});
    ops::linear(ctx, x, w.g_proj, nullptr, gate);
    ops::mul_sigmoid(ctx, gate, attended);
  }
  ops::linear(ctx, attended, w.o_proj, w.o_bias.if_defined(), out);
}

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

moe::DeviceCapturedRouting Moe::route(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step,
                                      int32_t* ids, float* weights, moe::DeviceCaptureRows capture) const {
  const int64_t tokens = x.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor logits = ctx.scratch_for_output(DType::F32, {tokens, num_experts});  // written in full by the GEMM
  ops::linear(ctx, x, gate_weight, gate_bias.if_defined(), logits);
  const int32_t* forced = step.forced != nullptr ? step.forced + layer_id * tokens * top_k : nullptr;
  return moe::route_on_device(ctx, logits, rule, forced, step.replayed, ids, weights, capture);
}

moe::DevicePhysicalRouting Moe::physical_routing(backend::Context& ctx, const ops::DeviceStep& step,
                                                 const moe::DeviceCapturedRouting& captured,
                                                 int32_t* load_counts) const {
  if (!map && !host_map()) return moe::DevicePhysicalRouting::without_replicas(captured);
  int32_t* physical = ctx.scratch_for_output(DType::I32, {captured.tokens(), top_k}).data<int32_t>();
  if (host_map()) return moe::map_on_host(ctx, *host_experts, captured, physical);
  return map->map(ctx, captured, step.seqs, physical, load_counts);
}

void Moe::run_experts(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step,
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

void Moe::run_experts_over_gpus(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step,
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

void Moe::route_and_run_experts(backend::Context& ctx, const Tensor& x, const ops::DeviceStep& step, int32_t* ids,
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
