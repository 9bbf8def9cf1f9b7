// DeepSeek-V4's per-sequence cache, in fixed-size blocks reached through block tables. Each layer
// declares its streams as CacheSpecs (v4_cache_specs):
//  - the shared K=V rows: attention reads the last `sliding_window` positions, so a sequence holds a
//    ring of blocks covering the window, whatever the capacity;
//  - for CSA/HCA layers, the compressor's per-position projections (kv and gate): read only
//    until the entry of their window (and, with overlap, of the next window) is emitted, so a
//    ring covering one or two windows;
//  - the compressed entries (one per completed window of `rate` positions), paged over the
//    capacity; CSA layers keep projections and entries again for their indexer (its keys).
// An entry depends only on the rows of its window (and of the previous window, for CSA), so
// entries are identical however the positions arrived: one prefill, chunks, or token by token.
#pragma once

#include <optional>
#include <vector>

#include "models/cache_spec.h"
#include "models/deepseek_v4/paged_rows.h"
#include "models/deepseek_v4/v4_spec.h"
#include "models/model_cache.h"

namespace r3::models {

struct V4CacheOptions {
  int64_t block_size = 16;  // rows per block (positions, or entries for the entry streams)
  uint64_t shuffle_seed = 0;  // != 0: scatter every stream's blocks over its pool (tests)
};

// What one V4 layer caches; the compressor and indexer streams exist for CSA/HCA (indexer: CSA).
struct V4CacheSpecs {
  CacheSpec window;
  std::optional<CacheSpec> compressor_rows, entries;
  std::optional<CacheSpec> index_rows, index_keys;
};
V4CacheSpecs v4_cache_specs(const DeepseekV4Spec& spec, int64_t layer);

// One compressor's cache for one sequence, as the compressor and attention kernels see it.
struct CompressorView {
  ops::PagedKv rows;          // per position: kv projection (keys), gate projection (values)
  ops::PagedKv entries;       // per completed window: the compressed entry (keys == values)
  int64_t* num_entries = nullptr;  // entries emitted so far
};

// A compressor's (or the indexer's) projections and entries for every sequence.
class CompressorCache {
 public:
  CompressorCache(const CacheSpec& rows, const CacheSpec& entries, int64_t max_seqs, int64_t capacity,
                  const V4CacheOptions& options, uint64_t seed);

  int64_t rate() const { return rows_.spec().rate; }
  CompressorView seq(int64_t seq);
  int64_t num_entries(int64_t seq) const { return num_entries_.at(static_cast<std::size_t>(seq)); }
  const PagedRows& rows() const { return rows_; }
  const PagedRows& entries() const { return entries_; }
  // Whether the projections the next window needs at `length` are still there, rows up to
  // newest having been written.
  bool can_resume(int64_t length, int64_t newest) const;
  // Entries of windows that reach past `length` are no longer valid.
  void truncate(int64_t seq, int64_t length);
  int64_t bytes() const { return rows_.bytes() + entries_.bytes(); }

 private:
  PagedRows rows_, entries_;
  std::vector<int64_t> num_entries_;  // per sequence
};

class V4Cache final : public ModelCache {
 public:
  V4Cache(const DeepseekV4Spec& spec, int64_t max_seqs, int64_t capacity, V4CacheOptions options = {});

  int64_t capacity() const override { return capacity_; }
  int64_t max_seqs() const override { return max_seqs_; }
  int64_t length(int64_t seq) const override { return lengths_.at(static_cast<std::size_t>(seq)); }
  // Shortening a sequence (other than to 0) is refused when a ring has already overwritten rows the
  // next token would need (the window's K=V rows, or an incomplete window's projections).
  void set_length(int64_t seq, int64_t length) override;
  std::string prefix_sharing_unsupported() const override {
    return "DeepSeek-V4's caches (sliding K=V rings, compressor rows, compressed and indexer entries) are "
           "per-sequence rings and running state, not yet blocks one sequence can hand to another";
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const V4CacheSpecs& specs(int64_t layer) const { return at(layer).specs; }
  // The layer's shared K=V rows (written after the step's attention has read them).
  PagedRows& window(int64_t layer) { return mutable_at(layer).window; }
  const PagedRows& window(int64_t layer) const { return at(layer).window; }
  // nullptr for a layer without a compressor (sliding) or without an indexer (HCA, sliding).
  CompressorCache* compressor(int64_t layer) { return optional_ptr(mutable_at(layer).compressor); }
  CompressorCache* indexer(int64_t layer) { return optional_ptr(mutable_at(layer).indexer); }
  // Bytes of every block of the layer's streams.
  int64_t pool_bytes(int64_t layer) const;

 private:
  struct Layer {
    V4CacheSpecs specs;
    PagedRows window;
    std::optional<CompressorCache> compressor, indexer;
  };
  const Layer& at(int64_t layer) const;
  Layer& mutable_at(int64_t layer) { return const_cast<Layer&>(at(layer)); }
  static CompressorCache* optional_ptr(std::optional<CompressorCache>& c) { return c ? &*c : nullptr; }

  int64_t capacity_, max_seqs_;
  std::vector<Layer> layers_;
  std::vector<int64_t> lengths_;
  std::vector<int64_t> high_water_;  // per sequence: the furthest length written since it was last cleared
};

}  // namespace r3::models
