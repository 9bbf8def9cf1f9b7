// What the CPU step-view ops (ops/step_view.h) share: the check that the blocks a token reaches
// through the step's tables exist in the pool, each token's window and write as the KvWindow ops
// take them, and the walk over each sequence's run of rows. Internal to the ops' CPU
// implementations.
#pragma once

#include <cstdint>

#include <algorithm>
#include <span>

#include "backend/workspace.h"
#include "core/check.h"
#include "ops/attention.h"
#include "ops/kv_write.h"
#include "ops/step_view.h"

namespace r3::ops::cpu {

// Throws, naming `op`, unless positions [begin, end) of `seq` have blocks of the float32 host pool
// in the step's tables.
inline void check_blocks(const StepView& step, const KvPool& pool, int32_t seq, int64_t begin, int64_t end,
                         const char* op) {
  R3_CHECK(step.block_tables != nullptr && pool.block_size > 0 && !pool.bf16, op,
           ": needs block tables and a float32 host pool");
  R3_CHECK(begin >= 0 && (end - 1) / pool.block_size < step.table_stride, op, ": positions [", begin, ", ", end,
           ") of sequence ", seq, " exceed its table of ", step.table_stride, " blocks of ", pool.block_size);
  const int32_t* table = step.block_tables + seq * step.table_stride;
  for (int64_t b = begin / pool.block_size; b <= (end - 1) / pool.block_size; ++b) {
    R3_CHECK(table[b] >= 0 && table[b] < pool.blocks, op, ": sequence ", seq, " has no block of the pool for positions ",
             b * pool.block_size, " on (block ", table[b], " of ", pool.blocks, ")");
  }
}

// Each token's window in `workspace` (the caller's scope): positions [pos - sliding_window + 1,
// pos] of its sequence (all up to pos when sliding_window is 0); a padding row's is empty.
inline std::span<KvWindow> step_windows(backend::Workspace& workspace, const StepView& step, const KvPool& pool,
                                        int64_t sliding_window, const char* op) {
  const std::span<KvWindow> windows = workspace.array<KvWindow>(step.tokens);
  for (int64_t t = 0; t < step.tokens; ++t) {
    const int32_t seq = step.seqs[t];
    if (seq < 0) {
      windows[static_cast<std::size_t>(t)] = KvWindow{};
      continue;
    }
    const int64_t pos = step.positions[t];
    const int64_t begin = sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
    check_blocks(step, pool, seq, begin, pos + 1, op);
    windows[static_cast<std::size_t>(t)] = {paged_kv(step, pool, seq), begin, pos + 1};
  }
  return windows;
}

// Each token's row to its position in `workspace` (the caller's scope); a padding row's writes
// nothing.
inline std::span<KvWrite> step_writes(backend::Workspace& workspace, const StepView& step, const KvPool& pool,
                                      const char* op) {
  const std::span<KvWrite> writes = workspace.array<KvWrite>(step.tokens);
  for (int64_t t = 0; t < step.tokens; ++t) {
    const int32_t seq = step.seqs[t];
    if (seq < 0) {
      writes[static_cast<std::size_t>(t)] = KvWrite{};
      continue;
    }
    const int64_t pos = step.positions[t];
    check_blocks(step, pool, seq, pos, pos + 1, op);
    writes[static_cast<std::size_t>(t)] = {paged_kv(step, pool, seq), pos};
  }
  return writes;
}

// Calls fn(seq, first, end) for each run of consecutive rows [first, end) of one sequence at
// consecutive positions, in row order (padding rows are in no run).
template <typename Fn>
void for_each_sequence_run(const StepView& step, Fn&& fn) {
  for (int64_t t = 0; t < step.tokens;) {
    const int32_t seq = step.seqs[t];
    if (seq < 0) {
      ++t;
      continue;
    }
    int64_t end = t + 1;
    while (end < step.tokens && step.seqs[end] == seq && step.positions[end] == step.positions[end - 1] + 1) ++end;
    fn(seq, t, end);
    t = end;
  }
}

}  // namespace r3::ops::cpu
