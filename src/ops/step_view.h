// What an attention op knows about a step, on either device: the step's per-token metadata and
// the sequences' block tables (in the memory of the context that runs the op: host arrays on the
// CPU, the step's one upload on a CUDA device, shared by every layer), and one layer's paged KV
// pool. An op derives each token's cache row and attention window from these alone (row =
// block_tables[seq][pos / block_size] * block_size + pos % block_size; window = the last
// `sliding_window` positions up to pos, or all of them), so the same layer code serves both
// devices and no layer on a device uploads anything of its own.
#pragma once

#include <cstdint>

namespace r3::ops {

struct StepView {
  int64_t tokens = 0;
  const int32_t* token_ids = nullptr;     // [tokens]
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* seqs = nullptr;          // [tokens]: sequence slot, or -1 for a padding row
  const int32_t* block_tables = nullptr;  // [slots, table_stride]: block ids, row-major
  int64_t table_stride = 0;               // blocks per sequence slot in block_tables
  int64_t max_context = 0;                // the largest position + 1 of the step (sizes split grids)
  const int32_t* logit_rows = nullptr;    // [logit_row_count]: the rows whose logits the step computes
  int64_t logit_row_count = 0;
  // Replayed routing, or nullptr when the step replays nothing: MoE layer j's forced ids are
  // [tokens, k] at forced + j * tokens * k; replayed[t] = 1 where row t replays them.
  const int32_t* forced = nullptr;
  const uint8_t* replayed = nullptr;
};

// One layer's paged cache: blocks of block_size rows of key_width / value_width
// elements, block b's rows starting at keys + b * block_size * key_width (values likewise). The
// elements are float32, or bfloat16 when `bf16` (a bf16 model's cache: half the bytes every
// decode step reads, the precision the model's own K/V projections carry); kernels widen them
// to float32 as they load them and round to nearest even as they store them. A recurrent-state
// layer (Kimi Delta Attention) has no blocks: keys and values are then every sequence slot's two
// states, [slots, key_width] and [slots, value_width], always float32.
struct KvPool {
  void* keys = nullptr;
  void* values = nullptr;
  int64_t key_width = 0;
  int64_t value_width = 0;
  int64_t block_size = 0;
  int64_t blocks = 0;  // pool size, for the kernels' bounds checks
  bool bf16 = false;
};

}  // namespace r3::ops
