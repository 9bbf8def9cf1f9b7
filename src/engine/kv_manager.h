// The KV cache as the engine hands it out: cache slots (sequences of the model's cache), blocks
// from the BlockPool, prefix caching over them, and the routed-experts rows kept with each block
// so that a prefix-cache hit returns the routing those cached keys and values were computed with.
//
// For a model whose cache can be paged (ModelCache::pool_blocks() > 0), block b of the pool is
// physical block b of every layer. For one whose memory is fixed per sequence (DeepSeek-V4), the
// blocks are only counted: the pool still bounds how many positions run at once and drives
// preemption, and prefix caching is off (ModelCache::prefix_sharing_unsupported says why).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/block_pool.h"
#include "engine/sequence.h"
#include "models/model_cache.h"

namespace r3::engine {

class KvManager {
 public:
  // per_row: routed ids per row (MoE layers x top_k); layers: MoE layers (margins per row).
  KvManager(models::ModelCache& cache, int64_t num_blocks, int64_t block_size, bool prefix_caching, int64_t per_row,
            int64_t layers);

  bool prefix_caching() const { return prefix_caching_; }
  int64_t block_size() const { return pool_.block_size(); }
  const BlockPool& pool() const { return pool_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_slots_.size()); }

  // Gives the sequence a cache slot and, with prefix caching, the cached blocks of its longest
  // cached prefix (whole blocks, at least one token left to run): `computed` and `rows` then
  // cover them. False (nothing changed) when no slot is free.
  bool admit(Sequence& s);
  // Adds blocks so positions [0, end) have one. False (nothing changed) when too few are free.
  bool grow(Sequence& s, int64_t end);
  // Returns the sequence's blocks and slot; it keeps its tokens and rows, `computed` goes to 0.
  void free(Sequence& s);
  // Points the cache at the sequence's blocks and cached length before it runs.
  void prepare(Sequence& s);
  // After a step computed positions [first, first + count) of `s` with routed ids `ids` and
  // margins `margins` ([count, MoE layers]): keeps the rows with their blocks and registers
  // blocks that are now full.
  void computed(Sequence& s, int64_t first, int64_t count, const int32_t* ids, const float* margins);

  // Blocks a sequence of `positions` tokens needs.
  int64_t blocks_for(int64_t positions) const { return (positions + block_size() - 1) / block_size(); }

 private:
  models::ModelCache& cache_;
  BlockPool pool_;
  bool paged_;           // the cache's blocks are the pool's
  bool prefix_caching_;  // blocks are shared through the pool's prefix cache
  int64_t per_row_;
  std::vector<int32_t> free_slots_;
  int64_t layers_;       // MoE layers: margins per row
  std::vector<int32_t> block_rows_;    // [blocks, block_size, per_row] routed ids kept with each block
  std::vector<float> block_margins_;   // [blocks, block_size, layers] their margins
};

}  // namespace r3::engine
