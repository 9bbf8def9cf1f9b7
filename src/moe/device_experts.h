// The routed experts on the GPU, the analogue of the `mega` path: one call takes the step's
// top-k ids and weights (as the routing kernel left them, on the device) and runs dispatch (the
// pairs grouped by expert on the device), the gate/up GEMVs with the activation, the down GEMV
// and the weighted combine, with no host round trip. Each used expert's weights are read once
// per step, however many tokens chose it.
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/device_routing.h"
#include "moe/physical_experts.h"

namespace r3::moe {

// Every expert's weights stacked on the device in one dtype: gate and up [experts, intermediate,
// hidden], down [experts, hidden, intermediate]; biases F32 [experts, intermediate] /
// [experts, hidden] or undefined. F32 or BF16 values; or, for a checkpoint published quantized,
// its own bytes: F8_E4M3 with F32 block scales [experts, ceil(rows / block_rows),
// ceil(cols / block_cols)] per matrix, or F4_E2M1X2 (MXFP4, the last dimension in bytes) with U8
// e8m0 scales [experts, rows, ceil(cols / 32)].
struct DeviceExperts {
  Tensor gate, up, down;
  // The layer's physical expert these start at: 0, or, on an expert-parallel rank holding only
  // its slice, the slice's first (device expert e is physical expert first + e).
  int32_t first = 0;
  Tensor gate_scales, up_scales, down_scales;  // quantized experts only
  int64_t block_rows = 0, block_cols = 0;      // FP8 only
  Tensor gate_bias, up_bias, down_bias;
  ExpertActivation activation;

  bool quantized() const { return gate.dtype() == DType::F8_E4M3 || gate.dtype() == DType::F4_E2M1X2; }
  // Values per row of gate/up (the hidden size) and of down (the intermediate size).
  int64_t hidden() const { return value_shape(gate)[2]; }
  int64_t intermediate() const { return gate.dim(1); }
};

// Physical experts [first, first + count) of a layer (count < 0: to the last), the slice an
// expert-parallel rank holds.
struct ExpertSlice {
  int32_t first = 0;
  int32_t count = -1;
};

// The physical experts' weights (those of `slice`), stacked and copied to ctx's device: quantized
// experts as they are (FP8 or MXFP4 bytes and their scales, never widened); others as `dtype`
// (F32: widened exactly; BF16: rounded to nearest even where stored wider). Biases F32. Stacks one
// matrix kind at a time on the host.
DeviceExperts upload_experts(backend::Context& ctx, const PhysicalExperts& experts, DType dtype,
                             ExpertSlice slice = {});

// Steps of at most this many tokens (decode of a few sequences) may skip the grouping by expert:
// their pairs run one by one (sm90_fused_experts.cu), or inside the monolithic kernel
// (moe/device_monolithic_moe.h), with the grouped kernels' arithmetic.
constexpr int64_t kPairMajorTokens = 4;

// Ints of scratch the pairs' grouping by expert takes: offsets, order, used experts, their count.
constexpr int64_t grouping_ints(int64_t experts, int64_t pairs) { return 2 * experts + pairs + 2; }

// Rows of the activated and expert_out scratch for `pairs` (token, choice) pairs: one per pair,
// and 32 more for the tensor-core path, which reads whole 16-row tiles past an expert's last pair.
constexpr int64_t expert_scratch_rows(int64_t pairs) { return pairs + 32; }

#if R3_WITH_CUDA
// hidden: device F32 [tokens, H]; routing: the layer's routing with its physical experts (what
// the EPLB map gives); out: device F32 [tokens, H] (overwritten). Device scratch: grouping I32 of
// grouping_ints(experts, tokens * k), activated F32 [expert_scratch_rows(tokens * k), I],
// expert_out F32 [expert_scratch_rows(tokens * k), H]. always_grouped (the `modular` path): the
// pairs are grouped by expert and the combine runs apart at every step size, steps of
// kPairMajorTokens included. The kernels themselves, over any ids: moe/cuda/fused_experts_of_ids.h.
void fused_experts_on_device(backend::Context& ctx, const Tensor& hidden, const DevicePhysicalRouting& routing,
                             const DeviceExperts& experts, Tensor& grouping, Tensor& activated, Tensor& expert_out,
                             Tensor& out, bool always_grouped = false);

// Expert parallelism (moe/ep): rows [n, H] that other ranks' dispatches brought here, with their
// physical ids (device [n], within the experts' slice: experts.first on), each through its
// expert's gate/up, activation and down into
// out [n, H] (no combine: the rows go back to the ranks they came from, which combine them).
// rows, out: device F32. The rows are grouped by expert on the device, then always the
// weight-streaming rows kernels, whose per-row sums do not depend on the other rows of a group,
// so a row gets the bits the one-rank rows kernels give its pair. Scratch from ctx's workspace.
void rows_through_their_experts_on_device(backend::Context& ctx, const Tensor& rows, const int32_t* ids,
                                          const DeviceExperts& experts, Tensor& out);
#endif

}  // namespace r3::moe
