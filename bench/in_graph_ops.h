// A batch-1 decode step's small ops, each timed as one of 32 copies of itself in one CUDA graph
// (gpu_event_timer.h: graph_mean_ms), so that each figure is what the op adds to a decode step's
// graph, not an eager launch's host overhead, at Qwen3-30B-A3B's shapes: add + RMSNorm of a 2048
// row; q/k norms, rotary and the key/value write of 32 query and 4 KV heads of 128 (prepare);
// attention over a 1024-token bf16 context; the router's projection (float32 [128, 2048]); the
// routing (top-8 of 128, softmax, renormalised, with capture and margins). One JSON line each
// ("bench":"in_graph").
#pragma once

#include "backend/context.h"

namespace r3::bench {

void small_ops_in_graph(backend::Context& gpu);

}  // namespace r3::bench
