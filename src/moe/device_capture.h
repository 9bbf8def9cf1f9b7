// The capture buffer of a step on the GPU. The routing kernel writes each MoE layer's logical ids
// into a device array [tokens, moe_layers, k], their routing margins into [tokens, moe_layers],
// and its combine weights into a layer-major device array [moe_layers, tokens, k] that the
// experts then read; at the end of the step asynchronous
// copies on a side stream (ordered after the step's kernels by an event) bring both into pinned
// host memory. Nothing in the step waits for the host: the host waits only when it collects the rows,
// after the step, for the routed-experts store.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "backend/context.h"
#include "moe/device_routing.h"

namespace r3::moe {

class DeviceCaptureBuffer {
 public:
  // Room for steps of up to max_tokens tokens.
  DeviceCaptureBuffer(backend::Context& ctx, int64_t max_tokens, int64_t moe_layers, int64_t top_k);
  ~DeviceCaptureBuffer();
  DeviceCaptureBuffer(const DeviceCaptureBuffer&) = delete;
  DeviceCaptureBuffer& operator=(const DeviceCaptureBuffer&) = delete;

  int64_t moe_layers() const { return layers_; }
  int64_t top_k() const { return k_; }

  // Orders the step's writes after the previous step's copy (a wait queued on the context's
  // stream, not on the host). Call before the step's first MoE layer.
  void begin_step();
  // Where MoE layer `moe_layer` of a step writes its ids (for route_on_device).
  DeviceCaptureRows layer_rows(int64_t moe_layer) const;
  // Where MoE layer `moe_layer` of a step of `tokens` tokens writes its weights: device [tokens, k].
  float* layer_weights(int64_t moe_layer, int64_t tokens) const;
  // Queues the copy of the step's first `tokens` rows to the host, after everything queued so far
  // on the context's stream. Returns at once.
  void end_step(int64_t tokens);
  // Waits for that copy only (not for later work on the context's stream) and returns the rows,
  // [tokens, moe_layers, k], valid until the next end_step.
  std::span<const int32_t> collect();
  // The weights of the same step, [moe_layers, tokens, k] (call after collect()).
  std::span<const float> collected_weights() const;
  // Its margins, [tokens, moe_layers] (call after collect()).
  std::span<const float> collected_margins() const;

 private:
  struct Impl;
  backend::Context& ctx_;
  int64_t max_tokens_, layers_, k_;
  int64_t pending_tokens_ = -1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace r3::moe
