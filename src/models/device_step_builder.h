// Builds a step's device metadata (ops/step_view.h) from its host form: token ids, positions,
// sequence slots, every slot's block table, the logit rows and any replayed routing go into one
// pinned staging buffer and reach the device in one asynchronous copy, before the step's first
// kernel. Every layer then reads the same arrays; no layer uploads anything. Two staging buffers
// alternate, so building a step never waits for the previous step's copy; the device arrays keep
// their addresses from step to step (a captured CUDA graph of a step stays valid).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/context.h"
#include "ops/step_view.h"

namespace r3::models {

class DeviceStepBuilder {
 public:
  // Room for steps of up to max_tokens tokens over `slots` sequence slots of up to
  // max_blocks_per_slot blocks each; a replayed routing has replay_layers MoE layers of
  // replay_k ids per token (0: steps replay nothing).
  DeviceStepBuilder(backend::Context& ctx, int64_t max_tokens, int64_t slots, int64_t max_blocks_per_slot,
                    int64_t replay_layers = 0, int64_t replay_k = 0);
  ~DeviceStepBuilder();
  DeviceStepBuilder(const DeviceStepBuilder&) = delete;
  DeviceStepBuilder& operator=(const DeviceStepBuilder&) = delete;

  // A replayed routing as the host holds it: forced [tokens, moe_layers, k] (layer-major on the
  // device), replayed [tokens] (empty: every row replays).
  struct Replay {
    std::span<const int32_t> forced;
    std::span<const uint8_t> replayed;
  };
  // tables[s]: slot s's block ids (shorter than max_blocks_per_slot, or empty for an unused slot);
  // logit_rows: empty for every row. The returned pointers are the same for every build; the
  // arrays hold this build's values until the next build's copy (queued after this step's work).
  ops::StepView build(std::span<const int32_t> token_ids, std::span<const int32_t> positions,
                        std::span<const int32_t> seqs, std::span<const std::span<const int32_t>> tables,
                        std::span<const int64_t> logit_rows = {}, Replay replay = {});

 private:
  struct Impl;
  backend::Context& ctx_;
  int64_t max_tokens_, slots_, stride_, replay_width_, replay_k_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace r3::models
