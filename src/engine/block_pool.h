// The engine's KV blocks: which are free, who holds each one, and which full blocks can be
// reused by a later request with the same token prefix (prefix caching).
//
// A block that fills up with positions [i * B, (i + 1) * B) of a sequence is registered under
// a chained key: (the 64-bit chain hash of blocks 0 .. i - 1, the B token ids of block i). The
// block's own tokens are compared exactly; the prefix before it is identified by its chain hash
// (a wrong hit needs two prefixes with equal 64-bit hashes).
// Blocks are reference-counted; when the last holder lets go, a registered block stays in the
// cache (at the back of an LRU list of free blocks) until a new block is needed and it is the
// least recently freed; an unregistered one goes to the front, to be reused first.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace r3::engine {

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks no sequence holds (registered ones among them can still be hit).
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }

  // A free block, now held once; evicts its registration if it had one. -1 when none is free.
  int32_t allocate();
  // Lets go of one hold on `block`.
  void release(int32_t block);

  // The chained key of a full block: its parent's key (0 for the first block) and its tokens.
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);
  // The registered block for (parent, tokens), now held once more; -1 when there is none.
  int32_t lookup(uint64_t parent, std::span<const int32_t> tokens);
  // Registers a full block a sequence holds under (parent, tokens); a no-op when that key already
  // has a block (the first one stays the cached one).
  void register_full(int32_t block, uint64_t parent, std::span<const int32_t> tokens);

  int32_t holders(int32_t block) const { return blocks_.at(static_cast<std::size_t>(block)).holders; }

  struct Stats {
    int64_t lookups = 0;   // blocks looked up
    int64_t hits = 0;      // of which found
    int64_t evictions = 0;  // registered blocks reused for new content
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Block {
    int32_t holders = 0;
    bool registered = false;
    uint64_t key = 0;  // chain hash, when registered
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator free_at;  // valid while holders == 0
  };
  Block& at(int32_t block);
  void take_from_free(Block& b);
  void forget(int32_t block);

  int64_t block_size_;
  std::vector<Block> blocks_;
  std::list<int32_t> free_;  // front: reused first
  std::unordered_multimap<uint64_t, int32_t> by_key_;
  Stats stats_;
};

}  // namespace r3::engine
