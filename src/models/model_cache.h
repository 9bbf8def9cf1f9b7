// What the engine needs from any model's per-sequence cache (KV rows, compressor state, ...):
// sequences, how many positions each holds, and the capacity. Each model family has its
// own cache type behind this interface.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace r3::models {

class ModelCache {
 public:
  virtual ~ModelCache() = default;
  virtual int64_t capacity() const = 0;   // positions per sequence
  virtual int64_t max_seqs() const = 0;
  // Positions [0, length) of a sequence are cached.
  virtual int64_t length(int64_t seq) const = 0;
  virtual void set_length(int64_t seq, int64_t length) = 0;
  void clear(int64_t seq) { set_length(seq, 0); }

  // Engine-managed blocks. A paged cache holds one pool of pool_blocks() blocks of block_size()
  // positions in every layer, and the engine gives each sequence its block table (one table for
  // all layers: block b is row range b of every layer's pool). Tables may share blocks (prefix
  // caching) as long as no shared block is written. pool_blocks() == 0: the cache's memory is
  // fixed per sequence and set_block_table is not available.
  virtual int64_t pool_blocks() const { return 0; }
  virtual int64_t block_size() const { return 0; }
  // Sequence `seq` reads and writes position p in block blocks[p / block_size()].
  virtual void set_block_table(int64_t seq, std::span<const int32_t> blocks);
  // Why a block filled by one sequence cannot be reused by another with the same token prefix
  // (prefix caching), or empty when it can.
  virtual std::string prefix_sharing_unsupported() const { return "its memory is fixed per sequence"; }
};

}  // namespace r3::models
