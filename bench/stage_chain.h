// What the structure of a batch-1 decode step costs apart from r3's kernels (bench/stage_chain.cu):
// a decode layer's chain of stages, run as separate kernels or as one persistent kernel.
#pragma once

#include "backend/context.h"

namespace r3::bench {

struct StageChainTiming {
  double ms_per_layer = 0;
  double tb_per_s = 0;  // the streamed bytes over the time
  int blocks = 0;       // the persistent kernel's grid (0 for the runs of a kernel a stage)
};

enum class StageChainRun {
  kKernels,          // a kernel a stage, one CUDA graph, programmatic dependent launch (as r3 runs)
  kPersistent,       // one cooperative kernel, the stages separated by a grid barrier
  kPersistentAhead,  // the same, each block loading its first share of the next streaming stage
                     // before the barrier
  kKernelsFolded,    // kKernels with each small stage run by every block of the streaming stage
                     // after it, once its first loads are issued
  kPersistentFolded, // kPersistentAhead with the small stages folded the same way
  kKernelsEarly,     // kKernels overlapped as r3's kernels are: each streaming kernel issues its
                     // first loads before its wait, each small kernel releases the next once it
                     // has waited, and the experts' gate/up releases down
};

// The projections' weights (q/k/v, o, the experts' gate/up and down) at two bytes a weight, as
// bfloat16, or one, as FP8 (its scales, 1/16384 of the bytes, left out); the keys and values and
// the float32 router stay as they are.
enum class StageChainWeights { kBf16, kFp8 };

// Bytes one layer streams (its stages' sum).
double stage_chain_bytes_per_layer(StageChainWeights weights);

// The chain of `layers` layers, run `run`'s way; the mean of 10 timed runs after 2 warm-ups. The
// persistent runs take blocks_per_sm blocks an SM (0: as many as fit), since their grid barrier
// costs more the more blocks arrive at it.
StageChainTiming time_stage_chain(backend::Context& gpu, StageChainRun run, StageChainWeights weights, int layers,
                                  int blocks_per_sm = 0);

}  // namespace r3::bench
