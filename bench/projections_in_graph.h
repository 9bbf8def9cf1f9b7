// A decode step's projections at Qwen3-30B-A3B's shapes, each timed as one of 32 copies of itself
// in one CUDA graph (gpu_event_timer.h: graph_mean_ms), the copies cycling over enough separate
// weight buffers (at least 160 MB) that each reads its weights from memory, not from L2 (the
// eager `linear` rows of the kernel bench run one weight back to back and are partly served by
// L2, so they swing from run to run). q/k/v fused (5120 x 2048) and o (2048 x 4096)
// in bf16 and FP8 (128 x 128 block scales), and the router (float32 128 x 2048), at 1 and 8 rows,
// as a bfloat16 model's step runs them (reduced precision). One JSON line each
// ("bench":"projection_in_graph"), with the bytes and the rate they came at.
#pragma once

#include "backend/context.h"

namespace r3::bench {

void projections_in_graph(backend::Context& gpu);

}  // namespace r3::bench
