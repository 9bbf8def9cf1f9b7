// One stream of DeepSeek-V4's cache for one layer (its sliding K=V rows, a compressor's
// projections, or compressed entries): a pool of fixed-size blocks of rows, and per sequence
// sequence a block table. Row r of a sequence lives in block table[r / block_size] at row r % block_size,
// and kernels reach it only through that view (ops::PagedKv), as the decoder's KvCache does.
//
// Why not KvCache itself: a V4 layer caches several streams with different row rates (one row
// per position, or one per window of `rate` positions) and different lifetimes, while KvCache
// holds one K/V pair per position per layer and owns the sequence lengths. The block mechanics
// are the same; the lengths and what each stream must keep are V4Cache's business.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/cache_spec.h"
#include "ops/attention.h"

namespace r3::models {

class PagedRows {
 public:
  // rows_per_seq: how far a sequence's rows reach (its block table covers them). held_rows: 0 when
  // every row must stay readable; otherwise rows are written in increasing order and only the
  // last held_rows written must stay readable, so the sequence owns a ring of just enough blocks.
  // shuffle_seed != 0 scatters the blocks over the pool (tests: nothing may depend on it).
  PagedRows(CacheSpec spec, int64_t max_seqs, int64_t rows_per_seq, int64_t held_rows, int64_t block_size,
            uint64_t shuffle_seed);

  const CacheSpec& spec() const { return spec_; }
  int64_t block_size() const { return block_size_; }
  int64_t blocks_per_seq() const { return seq_blocks_; }
  // Whether the sequence's blocks are reused (a ring shorter than its block table).
  bool is_ring() const { return seq_blocks_ < table_blocks_; }
  // Whether rows [oldest, newest] can all be read at once (newest: the last row written).
  bool holds(int64_t oldest, int64_t newest) const {
    return !is_ring() || oldest > newest || newest / block_size_ - oldest / block_size_ < seq_blocks_;
  }
  int64_t bytes() const { return static_cast<int64_t>((keys_.size() + values_.size()) * sizeof(float)); }

  std::span<const int32_t> block_table(int64_t seq) const;
  // The sequence's rows: keys (and values, the same rows when the spec has no value width).
  ops::PagedKv view(int64_t seq);

 private:
  CacheSpec spec_;
  int64_t max_seqs_, block_size_, table_blocks_, seq_blocks_;
  std::vector<float> keys_, values_;  // block b's rows at b * block_size * width
  std::vector<int32_t> tables_;       // [max_seqs, table_blocks_]
};

}  // namespace r3::models
