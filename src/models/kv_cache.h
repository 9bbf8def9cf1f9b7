// Key/value cache of the single-stream decoder: per layer, a pool of fixed-size blocks of
// positions; per (layer, sequence), a block table. Position p of a sequence lives in block
// table[p / block_size] at row p % block_size, and attention kernels reach the cache only
// through that view (ops::PagedKv), so that how blocks are handed out (each sequence's blocks up
// front, or the engine's block tables with prefix sharing: KvCacheOptions::pool_blocks) is the
// allocator's business alone.
// Each layer's storage follows the CacheSpec the layer declares; a sliding-window layer holds a
// ring of blocks just large enough for its window instead of the whole capacity; a recurrent-state
// layer holds one fixed-size state per sequence (no blocks), zeroed when the sequence restarts at
// length 0 and never rolled back.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/context.h"
#include "core/function_ref.h"
#include "core/tensor.h"
#include "models/cache_spec.h"
#include "models/model_cache.h"
#include "ops/attention.h"
#include "ops/step_view.h"

namespace r3::models {

// Refuses a cache of `bytes` (computed with checked arithmetic) larger than the machine's
// physical memory, naming `what`, the capacity in tokens and both sizes: a cache that cannot fit
// would otherwise be a bad_alloc or the OOM killer, after minutes of swapping.
void check_cache_memory(int64_t bytes, int64_t capacity, const char* what);

struct KvCacheOptions {
  int64_t block_size = 16;  // positions per block
  // 0: blocks are handed out in pool order (a sequence's blocks are consecutive). Otherwise the
  // free list is shuffled with this seed, which scatters every sequence's blocks across the pool
  // (used by tests: results must not depend on where blocks are).
  uint64_t shuffle_seed = 0;
  // > 0: engine-managed (ModelCache::set_block_table): every layer holds this many blocks, tables
  // start empty, and sliding-window layers keep every position instead of a ring (a block may
  // then be shared by sequences whose prefixes agree, which a ring's reuse would break).
  int64_t pool_blocks = 0;
  // Non-null: the pools live in this CUDA context's device memory (read and written only through
  // pool). Sliding-window layers then keep every position (no rings: a device step writes
  // all its rows before any attention reads them), and every layer has the same block tables
  // (the step uploads one set for all layers).
  backend::Context* device = nullptr;
  // The device pools' element type: F32, or BF16 for a bf16 model (the kernels widen on load and
  // round on store, ops/step_view.h). Host pools are always F32.
  DType device_dtype = DType::F32;
};

class KvCache final : public ModelCache {
 public:
  // One CacheSpec per layer; capacity: positions per sequence.
  KvCache(std::vector<CacheSpec> layers, int64_t max_seqs, int64_t capacity, KvCacheOptions options = {});

  int64_t capacity() const override { return capacity_; }
  int64_t max_seqs() const override { return max_seqs_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t block_size() const override { return block_size_; }
  int64_t pool_blocks() const override { return engine_pool_blocks_; }
  void set_block_table(int64_t seq, std::span<const int32_t> blocks) override;
  std::string prefix_sharing_unsupported() const override;
  // Whether position `pos` of the sequence has a block to live in (always, unless engine-managed).
  bool covers(int64_t seq, int64_t pos) const;
  const CacheSpec& spec(int64_t layer) const { return at(layer).spec; }
  // Bytes one cached position costs across all layers.
  int64_t bytes_per_token() const;
  // Blocks of the layer's pool each sequence owns: enough for the capacity, or for a
  // sliding-window layer the ring that covers its window (never more than the capacity needs).
  int64_t blocks_per_seq(int64_t layer) const { return at(layer).seq_blocks; }
  // Bytes of all blocks of all layers.
  int64_t pool_bytes() const;
  // The most new positions of one sequence an attention pass may write before it reads the cache:
  // unlimited (the capacity) unless the layer's blocks form a ring, whose oldest blocks the
  // writes would otherwise overwrite while earlier tokens of the pass still need them.
  int64_t positions_per_pass(int64_t layer) const { return at(layer).positions_per_pass; }

  // Logical block i of the sequence (positions [i * block_size, (i + 1) * block_size)) is
  // physical block block_table(layer, sequence)[i] of the layer's pool.
  std::span<const int32_t> block_table(int64_t layer, int64_t seq) const;
  // The paged view of (layer, sequence) that the KvWindow ops read and write through (host pools only).
  ops::PagedKv view(int64_t layer, int64_t seq);
  // A recurrent-state layer's state of `seq`: [spec.key_width] then [spec.value_width] floats
  // (device memory when on_device(); the layer's pool then has every slot's, slot-major).
  struct SequenceState {
    float* first = nullptr;
    float* second = nullptr;
  };
  SequenceState state(int64_t layer, int64_t seq);
  // Whether the pools are in device memory (KvCacheOptions::device).
  bool on_device() const { return on_device_; }
  // The layer's pool as the step-view ops take it (ops/step_view.h), host or device.
  ops::KvPool pool(int64_t layer);
  // `step` with this layer's block tables: on the host each layer has its own (a ring's differ);
  // a device step already carries the one set every layer shares.
  ops::StepView step_for_layer(const ops::StepView& step, int64_t layer) const;
  // Whether the layer's blocks form a ring (a sliding-window layer of a host cache that hands out
  // its own blocks): a step may then bring only positions_per_pass positions of a sequence at once.
  bool rings(int64_t layer) const { return is_ring(at(layer)); }
  // A number no other KvCache of this process has had: a CUDA graph recorded against this
  // cache's pools is valid for this cache only (a later one may reuse the same addresses with
  // another layout, so the address alone does not tell).
  uint64_t serial() const { return serial_; }

  // Positions [0, length) of a sequence hold valid rows.
  int64_t length(int64_t seq) const override { return lengths_.at(static_cast<std::size_t>(seq)); }
  // Shortening a sequence (other than to 0) is refused when a sliding-window ring has already
  // overwritten positions the next token's window would need, or when a recurrent state has
  // taken in positions past the new length. Length 0 zeroes the recurrent states.
  void set_length(int64_t seq, int64_t length) override;

 private:
  struct Layer {
    CacheSpec spec;
    int64_t seq_blocks = 0;         // physical blocks per sequence
    int64_t positions_per_pass = 0;
    Tensor keys, values;  // pool: block b's rows at b * block_size * width (flat, host or device)
    int64_t pool_blocks = 0;
    std::vector<int32_t> tables;      // [max_seqs, table_blocks_]
  };
  const Layer& at(int64_t layer) const;
  static uint64_t next_serial();
  bool is_ring(const Layer& layer) const { return layer.seq_blocks < table_blocks_; }
  static bool is_recurrent(const Layer& layer) { return layer.spec.kind == CacheSpec::Kind::kRecurrentState; }
  const Layer& paged_layer() const;  // the first layer with block tables

  int64_t max_seqs_, capacity_, block_size_, table_blocks_;
  int64_t engine_pool_blocks_ = 0;
  bool on_device_ = false;
  backend::Context* device_ = nullptr;  // the pools' context when on_device_
  uint64_t serial_ = next_serial();
  std::vector<Layer> layers_;
  std::vector<int64_t> lengths_;
  std::vector<int64_t> high_water_;  // per sequence: the furthest length written since it was last cleared
};

// Calls fn(first, pass) for each pass of a step over `layer`: the tokens [first, first +
// pass.tokens) as a step of their own (metadata offset, no replayed routing), each pass bringing
// at most positions_per_pass positions of a sequence. One pass over the whole step unless the
// layer rings (host caches only: the metadata is then host memory). Counts in `workspace`.
void for_each_pass(const KvCache& cache, int64_t layer, const ops::StepView& step, backend::Workspace& workspace,
                   FunctionRef<void(int64_t first, const ops::StepView& pass)> fn);

}  // namespace r3::models
