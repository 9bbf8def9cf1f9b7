// A step's runs for the kernels of recurrent layers (short convolutions, the delta rule): a run is
// a sequence's consecutive positions in consecutive rows, which its state takes in one after the
// other. The host checks that each sequence of a step has one run continuing its cached length
// (models/cuda/device_decoder.cpp); the kernels find the runs from the step's device metadata,
// one thread or block per row, so that a step's launch shape depends on its row count only (a
// CUDA graph of it serves any mix of decodes and prefills). Internal to ops/cuda.
#pragma once

#include <cstdint>

#include "ops/step_view.h"

namespace r3::ops::cuda {

// Whether row r begins a run. Padding rows begin none and belong to none.
__device__ inline bool starts_run(const StepView& step, int64_t r) {
  const int32_t seq = step.seqs[r];
  if (seq < 0) return false;
  return r == 0 || step.seqs[r - 1] != seq || step.positions[r - 1] + 1 != step.positions[r];
}

// One past the last row of the run that begins at row r.
__device__ inline int64_t run_end(const StepView& step, int64_t r) {
  int64_t end = r + 1;
  while (end < step.tokens && step.seqs[end] == step.seqs[r] && step.positions[end] == step.positions[end - 1] + 1) ++end;
  return end;
}

}  // namespace r3::ops::cuda
