// Builds a step's device metadata (ops/device_step.h) from its host form: token ids, positions,
// sequence slots and every slot's block table go into one pinned staging buffer and reach the
// device in one asynchronous copy, before the step's first kernel. Every layer then reads the
// same arrays; no layer uploads anything. Two staging buffers alternate, so building a step
// never waits for the previous step's copy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/context.h"
#include "ops/device_step.h"

namespace r3::models {

class DeviceStepBuilder {
 public:
  // Room for steps of up to max_tokens tokens over `slots` sequence slots of up to
  // max_blocks_per_slot blocks each.
  DeviceStepBuilder(backend::Context& ctx, int64_t max_tokens, int64_t slots, int64_t max_blocks_per_slot);
  ~DeviceStepBuilder();
  DeviceStepBuilder(const DeviceStepBuilder&) = delete;
  DeviceStepBuilder& operator=(const DeviceStepBuilder&) = delete;

  // tables[s]: slot s's block ids (shorter than max_blocks_per_slot, or empty for an unused slot).
  // The returned pointers stay valid until the build after next.
  ops::DeviceStep build(std::span<const int32_t> token_ids, std::span<const int32_t> positions,
                        std::span<const int32_t> seqs, std::span<const std::span<const int32_t>> tables);

 private:
  struct Impl;
  backend::Context& ctx_;
  int64_t max_tokens_, slots_, stride_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace r3::models
