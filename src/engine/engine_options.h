// What the serving engine is configured with (EngineOptions) and what it reports (EngineStats).
// Under expert parallelism (expert_parallel > 1) the scheduler and KV options apply to each rank,
// and the statistics are the ranks' summed.
#pragma once

#include <cstdint>

#include "engine/scheduler.h"

namespace r3::engine {

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t block_size = 16;
  // KV blocks in the pool; 0: enough for max_running sequences of max_model_len positions.
  int64_t kv_blocks = 0;
  // Positions per sequence (prompt + outputs); 0: the model's max_position_embeddings.
  int64_t max_model_len = 0;
  bool prefix_caching = true;  // turned off (with a start-up message) where the cache cannot share
  // Expert-parallel ranks (--ep): each holds its own requests and KV cache (attention is data
  // parallel) and runs the routed experts of its slice of the physical experts for every rank's
  // tokens. 1: a single rank.
  int expert_parallel = 1;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens_computed = 0;  // prefill and recompute tokens run
  int64_t decode_tokens = 0;           // one-token steps of sequences that had sampled
  int64_t max_batch_sequences = 0;
  int64_t batch_sequences_sum = 0;     // / steps: mean sequences per step
  int64_t prefix_blocks_looked_up = 0, prefix_blocks_hit = 0;
  int64_t preemptions = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0;
  double step_seconds = 0;
  double max_step_seconds = 0;  // the longest step (a prefill, an EPLB weight move)
  double routed_seconds = 0;  // handling routed rows after the model step (the capture's host side)
  int64_t running = 0, waiting = 0;
  // Expert parallelism: (token, choice) rows a rank sent to another rank's experts.
  int64_t expert_rows_exchanged = 0;
  // Expert parallelism: bytes of expert weights EPLB moved from one rank to another.
  int64_t expert_weight_bytes_moved = 0;

  // Adds another rank's counters (routed_seconds: the slowest rank's, the ranks run at once). The
  // group's steps, step_seconds, max_step_seconds and max_batch_sequences are its own: the
  // engine counts, times and sizes its steps over all ranks.
  void add_rank(const EngineStats& rank);
};

}  // namespace r3::engine
