#include "engine/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace r3::engine {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size) : block_size_(block_size) {
  R3_CHECK(num_blocks > 0 && num_blocks <= INT32_MAX && block_size > 0, "block pool: ", num_blocks,
           " blocks of ", block_size, " positions");
  blocks_.resize(static_cast<std::size_t>(num_blocks));
  for (int32_t b = 0; b < static_cast<int32_t>(num_blocks); ++b) {
    blocks_[static_cast<std::size_t>(b)].free_at = free_.insert(free_.end(), b);
  }
}

BlockPool::Block& BlockPool::at(int32_t block) {
  R3_CHECK(block >= 0 && block < num_blocks(), "block pool: block ", block, " out of range");
  return blocks_[static_cast<std::size_t>(block)];
}

void BlockPool::take_from_free(Block& b) {
  if (b.holders == 0) free_.erase(b.free_at);
  ++b.holders;
}

void BlockPool::forget(int32_t block) {
  Block& b = at(block);
  if (!b.registered) return;
  auto [first, last] = by_key_.equal_range(b.key);
  for (auto it = first; it != last; ++it) {
    if (it->second == block) {
      by_key_.erase(it);
      break;
    }
  }
  b.registered = false;
  b.tokens.clear();
}

int32_t BlockPool::allocate() {
  if (free_.empty()) return -1;
  const int32_t block = free_.front();
  Block& b = at(block);
  if (b.registered) {
    ++stats_.evictions;
    forget(block);
  }
  take_from_free(b);
  return block;
}

void BlockPool::release(int32_t block) {
  Block& b = at(block);
  R3_CHECK(b.holders > 0, "block pool: block ", block, " released more often than held");
  if (--b.holders > 0) return;
  // Registered blocks wait at the back (least recently freed are evicted first); plain ones are
  // reused first.
  b.free_at = b.registered ? free_.insert(free_.end(), block) : free_.insert(free_.begin(), block);
}

uint64_t BlockPool::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // splitmix64 steps over the parent and each token: well mixed, the same on every platform.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent);
  for (const int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

int32_t BlockPool::lookup(uint64_t parent, std::span<const int32_t> tokens) {
  ++stats_.lookups;
  auto [first, last] = by_key_.equal_range(chain_hash(parent, tokens));
  for (auto it = first; it != last; ++it) {
    Block& b = at(it->second);
    if (b.parent == parent && std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end())) {
      ++stats_.hits;
      take_from_free(b);
      return it->second;
    }
  }
  return -1;
}

void BlockPool::register_full(int32_t block, uint64_t parent, std::span<const int32_t> tokens) {
  R3_CHECK(static_cast<int64_t>(tokens.size()) == block_size_, "block pool: registering a block of ",
           tokens.size(), " tokens, blocks hold ", block_size_);
  Block& b = at(block);
  R3_CHECK(b.holders > 0, "block pool: registering block ", block, " that nobody holds");
  if (b.registered) return;
  const uint64_t key = chain_hash(parent, tokens);
  auto [first, last] = by_key_.equal_range(key);
  for (auto it = first; it != last; ++it) {
    const Block& other = at(it->second);
    if (other.parent == parent && std::equal(other.tokens.begin(), other.tokens.end(), tokens.begin(), tokens.end())) {
      return;  // an equal block is cached already
    }
  }
  b.registered = true;
  b.key = key;
  b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  by_key_.emplace(key, block);
}

}  // namespace r3::engine
