#include "engine/kv_manager.h"

#include <algorithm>

#include "core/check.h"
#include "core/checked.h"

namespace r3::engine {

KvManager::KvManager(models::ModelCache& cache, int64_t num_blocks, int64_t block_size, bool prefix_caching,
                     int64_t per_row, int64_t layers)
    : cache_(cache),
      pool_(num_blocks, block_size),
      paged_(cache.pool_blocks() > 0),
      prefix_caching_(prefix_caching),
      per_row_(per_row),
      layers_(layers) {
  R3_CHECK(!paged_ || (cache.pool_blocks() == num_blocks && cache.block_size() == block_size),
           "KV manager: the cache holds ", cache.pool_blocks(), " blocks of ", cache.block_size(), ", not ",
           num_blocks, " of ", block_size);
  R3_CHECK(!prefix_caching_ || cache.prefix_sharing_unsupported().empty(),
           "prefix caching: ", cache.prefix_sharing_unsupported());
  for (int64_t s = cache.max_seqs() - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
  if (prefix_caching_) {
    block_rows_.assign(static_cast<std::size_t>(checked_mul(checked_mul(num_blocks, block_size, "routed rows"),
                                                            per_row, "routed rows")),
                       0);
    block_margins_.assign(static_cast<std::size_t>(checked_mul(checked_mul(num_blocks, block_size, "routing margins"),
                                                               layers, "routing margins")),
                          0.0f);
  }
}

bool KvManager::admit(Sequence& s) {
  if (free_slots_.empty()) return false;
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  s.computed = 0;
  s.blocks.clear();
  s.block_keys.clear();
  if (!prefix_caching_ || !s.params->forced_routing.empty() || s.params->prompt_logprobs) return true;
  // Whole blocks within all tokens but the last (whose logits the next sample needs).
  const int64_t bs = block_size();
  const int64_t candidates = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
  uint64_t parent = 0;
  for (int64_t i = 0; i < candidates; ++i) {
    const std::span<const int32_t> tokens(s.tokens.data() + i * bs, static_cast<std::size_t>(bs));
    const int32_t block = pool_.lookup(parent, tokens);
    if (block < 0) break;
    s.blocks.push_back(block);
    parent = BlockPool::chain_hash(parent, tokens);
    s.block_keys.push_back(parent);
    // The rows these keys and values were computed with; rows the sequence already has (it ran
    // before a preemption) are its own and stay.
    const int64_t first = i * bs;
    for (int64_t p = s.routed_rows(); p < first + bs; ++p) {
      if (p < first) continue;
      const auto* src = block_rows_.data() + (block * bs + (p - first)) * per_row_;
      s.rows.insert(s.rows.end(), src, src + per_row_);
      const float* margins = block_margins_.data() + (block * bs + (p - first)) * layers_;
      s.margins.insert(s.margins.end(), margins, margins + layers_);
    }
  }
  s.computed = static_cast<int64_t>(s.blocks.size()) * bs;
  if (s.preemptions == 0) s.cached_prompt_tokens = std::min(s.computed, s.prompt_len);
  return true;
}

bool KvManager::grow(Sequence& s, int64_t end) {
  const int64_t need = blocks_for(end) - static_cast<int64_t>(s.blocks.size());
  if (need <= 0) return true;
  if (pool_.num_free() < need) return false;
  for (int64_t i = 0; i < need; ++i) s.blocks.push_back(pool_.allocate());
  return true;
}

void KvManager::free(Sequence& s) {
  for (const int32_t b : s.blocks) pool_.release(b);
  s.blocks.clear();
  s.block_keys.clear();
  s.computed = 0;
  if (s.slot >= 0) {
    cache_.clear(s.slot);
    free_slots_.push_back(s.slot);
    s.slot = -1;
  }
}

void KvManager::prepare(Sequence& s) {
  if (paged_) cache_.set_block_table(s.slot, s.blocks);
  cache_.set_length(s.slot, s.computed);
}

void KvManager::computed(Sequence& s, int64_t first, int64_t count, const int32_t* ids, const float* margins) {
  // Rows the sequence does not have yet are its routing; a recompute after preemption yields the
  // same rows (every row is computed the same whatever the batch), and the first ones stay.
  for (int64_t p = s.routed_rows(); p < first + count; ++p) {
    const int32_t* row = ids + (p - first) * per_row_;
    s.rows.insert(s.rows.end(), row, row + per_row_);
    const float* margin = margins + (p - first) * layers_;
    s.margins.insert(s.margins.end(), margin, margin + layers_);
  }
  s.computed = first + count;
  if (!prefix_caching_ || !s.params->forced_routing.empty()) return;
  const int64_t bs = block_size();
  for (int64_t p = first; p < first + count; ++p) {
    const int32_t block = s.blocks[static_cast<std::size_t>(p / bs)];
    std::copy_n(ids + (p - first) * per_row_, per_row_, block_rows_.data() + (block * bs + p % bs) * per_row_);
    std::copy_n(margins + (p - first) * layers_, layers_, block_margins_.data() + (block * bs + p % bs) * layers_);
  }
  // Register the blocks that are now full, chaining from the last key.
  for (auto i = static_cast<int64_t>(s.block_keys.size()); (i + 1) * bs <= s.computed; ++i) {
    const uint64_t parent = i == 0 ? 0 : s.block_keys.back();
    const std::span<const int32_t> tokens(s.tokens.data() + i * bs, static_cast<std::size_t>(bs));
    pool_.register_full(s.blocks[static_cast<std::size_t>(i)], parent, tokens);
    s.block_keys.push_back(BlockPool::chain_hash(parent, tokens));
  }
}

}  // namespace r3::engine
