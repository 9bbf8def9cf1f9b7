#include "models/deepseek_v4/paged_rows.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

#include "core/check.h"
#include "core/checked.h"
#include "models/kv_cache.h"

namespace r3::models {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

PagedRows::PagedRows(CacheSpec spec, int64_t max_seqs, int64_t rows_per_seq, int64_t held_rows, int64_t block_size,
                     uint64_t shuffle_seed)
    : spec_(spec), max_seqs_(max_seqs), block_size_(block_size) {
  R3_CHECK(max_seqs > 0 && rows_per_seq >= 0 && held_rows >= 0 && block_size > 0 && spec.key_width > 0,
           "V4 cache: bad stream geometry (", max_seqs, " seqs, ", rows_per_seq, " rows, blocks of ", block_size,
           ")");
  table_blocks_ = ceil_div(rows_per_seq, block_size_);
  seq_blocks_ = table_blocks_;
  // Any held_rows consecutive rows touch at most ceil((held_rows - 1) / B) + 1 blocks.
  if (held_rows > 0) seq_blocks_ = std::min(seq_blocks_, ceil_div(held_rows - 1, block_size_) + 1);
  const int64_t pool_blocks = checked_mul(max_seqs_, seq_blocks_, "V4 cache: seqs x blocks");
  R3_CHECK(pool_blocks <= INT32_MAX, "V4 cache: ", pool_blocks, " blocks exceed int32 block ids");
  {
    const int64_t rows = checked_mul(pool_blocks, block_size_, "V4 cache: blocks x block size");
    const int64_t width = checked_add(spec_.key_width, spec_.value_width, "V4 cache: key + value width");
    check_cache_memory(checked_mul(checked_mul(rows, width, "V4 cache: rows x width"), int64_t{4}, "V4 cache: bytes"),
                       rows, "the V4 KV cache");
  }
  keys_.assign(static_cast<std::size_t>(pool_blocks * block_size_ * spec_.key_width), 0.0f);
  values_.assign(static_cast<std::size_t>(pool_blocks * block_size_ * spec_.value_width), 0.0f);
  // Every sequence takes its blocks from the free list up front (as KvCache does today).
  std::vector<int32_t> free_list(static_cast<std::size_t>(pool_blocks));
  std::iota(free_list.begin(), free_list.end(), 0);
  if (shuffle_seed != 0) {
    std::mt19937_64 rng(shuffle_seed);
    for (std::size_t i = free_list.size(); i > 1; --i) {  // Fisher-Yates, the same on every platform
      std::swap(free_list[i - 1], free_list[static_cast<std::size_t>(rng() % i)]);
    }
  }
  tables_.resize(static_cast<std::size_t>(max_seqs_ * table_blocks_));
  for (int64_t s = 0; s < max_seqs_; ++s) {
    for (int64_t i = 0; i < table_blocks_; ++i) {  // a ring: logical block i is the sequence's block i mod ring
      tables_[static_cast<std::size_t>(s * table_blocks_ + i)] =
          free_list[static_cast<std::size_t>(s * seq_blocks_ + i % seq_blocks_)];
    }
  }
}

std::span<const int32_t> PagedRows::block_table(int64_t seq) const {
  R3_CHECK(seq >= 0 && seq < max_seqs_, "V4 cache: seq ", seq, " out of range");
  return std::span<const int32_t>(tables_).subspan(static_cast<std::size_t>(seq * table_blocks_),
                                                   static_cast<std::size_t>(table_blocks_));
}

ops::PagedKv PagedRows::view(int64_t seq) {
  float* values = spec_.value_width > 0 ? values_.data() : keys_.data();
  const int64_t value_width = spec_.value_width > 0 ? spec_.value_width : spec_.key_width;
  return {keys_.data(), values, spec_.key_width, value_width, block_size_, block_table(seq)};
}

}  // namespace r3::models
