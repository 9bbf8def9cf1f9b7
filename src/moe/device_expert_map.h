// EPLB on the GPU: PhysicalExperts::map's device twin and the per-step expert loads.
//
// DeviceExpertMap sends each (token, choice) of a step's logical routing to replica
// (token * top_k + choice) % replicas of its expert, the CPU's choice exactly, and counts the
// pairs of non-padding rows per physical expert on the device. It runs after the routing kernel
// has written the logical ids into the capture buffer, so what is captured never depends on the
// placement. After a rebalance its tables are rewritten in place: recorded CUDA graphs keep
// pointing at them.
//
// DeviceLoadCounts holds a step's counts for every MoE layer; they reach the host by an
// asynchronous copy queued after the step, and the host reads them after the step, for the
// engine's load windows.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "backend/context.h"
#include "moe/device_routing.h"
#include "moe/expert_placement.h"
#include "moe/physical_experts.h"

namespace r3::moe {

class DeviceExpertMap {
 public:
  DeviceExpertMap(backend::Context& ctx, const ExpertPlacement& placement);
  ~DeviceExpertMap();
  DeviceExpertMap(const DeviceExpertMap&) = delete;
  DeviceExpertMap& operator=(const DeviceExpertMap&) = delete;

  // A new placement of the same numbers of logical and physical experts, between steps.
  void update(const ExpertPlacement& placement);
  int64_t num_physical() const { return physical_; }
  // The tables on the device (the mega kernel maps with them): each logical expert's first
  // replica index [logical + 1], then the replicas' physical ids.
  const int32_t* offsets() const { return tables_; }
  const int32_t* replicas() const { return tables_ + logical_ + 1; }

  // captured: a layer's routing (valid ids); seqs: device [tokens], -1 for a padding row (not
  // counted); physical: device [tokens, k], written; counts: device [num_physical] added to, or
  // nullptr. Returns the routing with `physical` as its experts.
  DevicePhysicalRouting map(backend::Context& ctx, const DeviceCapturedRouting& captured, const int32_t* seqs,
                            int32_t* physical, int32_t* counts) const;

 private:
  backend::Context& ctx_;
  int64_t logical_ = 0, physical_ = 0;
  int32_t* tables_ = nullptr;  // device: replica offsets [logical + 1], then the replicas [physical]
};

#if R3_WITH_CUDA
// The map of a layer whose map function a test replaced (PhysicalExperts::has_map_function), run
// on the host as the CPU paths run it: the logical ids come down, each pair goes through the
// function, the physical ids go up to `physical` (device [tokens, k]). It waits inside the step,
// so it only ever runs in tests, which use it to show that capture happens before the map.
DevicePhysicalRouting map_on_host(backend::Context& ctx, const PhysicalExperts& experts,
                                  const DeviceCapturedRouting& captured, int32_t* physical);
#endif

class DeviceLoadCounts {
 public:
  // Room for `width` physical experts in each of `moe_layers` layers.
  DeviceLoadCounts(backend::Context& ctx, int64_t moe_layers, int64_t width);
  ~DeviceLoadCounts();
  DeviceLoadCounts(const DeviceLoadCounts&) = delete;
  DeviceLoadCounts& operator=(const DeviceLoadCounts&) = delete;

  int64_t width() const { return width_; }
  // Layer j's device counts [width].
  int32_t* layer(int64_t moe_layer) const;
  // Queues the zeroing of every count (before the step's layers).
  void begin_step();
  // Queues the copy to the host after everything queued so far; returns at once.
  void end_step();
  // Waits for that copy and returns the counts, [moe_layers, width].
  std::span<const int32_t> collect();

 private:
  struct Impl;
  backend::Context& ctx_;
  int64_t layers_, width_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace r3::moe
