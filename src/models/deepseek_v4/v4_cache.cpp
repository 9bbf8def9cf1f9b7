#include "models/deepseek_v4/v4_cache.h"

#include <algorithm>

#include "core/check.h"

namespace r3::models {

V4CacheSpecs v4_cache_specs(const DeepseekV4Spec& spec, int64_t layer) {
  V4CacheSpecs out{CacheSpec::shared_sliding_kv(spec.head_dim, spec.sliding_window), {}, {}, {}, {}};
  const V4AttentionKind kind = spec.layer_kinds.at(static_cast<std::size_t>(layer));
  if (kind == V4AttentionKind::kCompressed) {
    out.compressor_rows = CacheSpec::compressor_rows(2 * spec.head_dim, spec.csa_rate, true);
    out.entries = CacheSpec::compressed_entries(spec.head_dim, spec.csa_rate);
    out.index_rows = CacheSpec::compressor_rows(2 * spec.index_head_dim, spec.csa_rate, true);
    out.index_keys = CacheSpec::compressed_entries(spec.index_head_dim, spec.csa_rate);
  } else if (kind == V4AttentionKind::kHeavy) {
    out.compressor_rows = CacheSpec::compressor_rows(spec.head_dim, spec.hca_rate, false);
    out.entries = CacheSpec::compressed_entries(spec.head_dim, spec.hca_rate);
  }
  return out;
}

namespace {

// The first projection row the next window needs at `length` (the previous window's too, with overlap).
int64_t first_needed_row(const CacheSpec& rows, int64_t length) {
  return std::max<int64_t>(0, (length / rows.rate - (rows.overlap ? 1 : 0)) * rows.rate);
}

uint64_t stream_seed(uint64_t seed, int64_t layer, int64_t stream) {
  return seed == 0 ? 0 : seed + static_cast<uint64_t>(8 * layer + stream);
}

}  // namespace

CompressorCache::CompressorCache(const CacheSpec& rows, const CacheSpec& entries, int64_t max_seqs,
                                 int64_t capacity, const V4CacheOptions& options, uint64_t seed)
    // Emitting window w's entry right after its last row is written reads the last
    // (1 + overlap) * rate rows, the oldest rows any later step still needs.
    : rows_(rows, max_seqs, capacity, (rows.overlap ? 2 : 1) * rows.rate, options.block_size, seed),
      entries_(entries, max_seqs, capacity / entries.rate, 0, options.block_size, seed == 0 ? 0 : seed + 1),
      num_entries_(static_cast<std::size_t>(max_seqs), 0) {}

CompressorView CompressorCache::seq(int64_t seq) {
  return {rows_.view(seq), entries_.view(seq), &num_entries_.at(static_cast<std::size_t>(seq))};
}

bool CompressorCache::can_resume(int64_t length, int64_t newest) const {
  const int64_t first = first_needed_row(rows_.spec(), length);
  return first >= length || rows_.holds(first, newest);
}

void CompressorCache::truncate(int64_t seq, int64_t length) {
  int64_t& n = num_entries_.at(static_cast<std::size_t>(seq));
  n = std::min(n, length / rate());
}

V4Cache::V4Cache(const DeepseekV4Spec& spec, int64_t max_seqs, int64_t capacity, V4CacheOptions options)
    : capacity_(capacity),
      max_seqs_(max_seqs),
      lengths_(static_cast<std::size_t>(max_seqs), 0),
      high_water_(static_cast<std::size_t>(max_seqs), 0) {
  R3_CHECK(max_seqs > 0 && capacity > 0, "cache dimensions must be positive");
  R3_CHECK(options.block_size > 0, "V4 cache: block size must be positive");
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    V4CacheSpecs specs = v4_cache_specs(spec, l);
    // The step's attention reads its own positions' K=V rows from the step and writes them to the
    // cache afterwards, so the cache only has to keep the window - 1 positions before a token.
    const int64_t held = std::max<int64_t>(1, specs.window.window - 1);
    Layer layer{specs,
                PagedRows(specs.window, max_seqs, capacity, held, options.block_size,
                          stream_seed(options.shuffle_seed, l, 0)),
                {},
                {}};
    if (specs.compressor_rows) {
      layer.compressor.emplace(*specs.compressor_rows, *specs.entries, max_seqs, capacity, options,
                               stream_seed(options.shuffle_seed, l, 2));
    }
    if (specs.index_rows) {
      layer.indexer.emplace(*specs.index_rows, *specs.index_keys, max_seqs, capacity, options,
                            stream_seed(options.shuffle_seed, l, 4));
    }
    layers_.push_back(std::move(layer));
  }
}

const V4Cache::Layer& V4Cache::at(int64_t layer) const {
  R3_CHECK(layer >= 0 && layer < num_layers(), "cache: layer ", layer, " out of range");
  return layers_[static_cast<std::size_t>(layer)];
}

int64_t V4Cache::pool_bytes(int64_t layer) const {
  const Layer& l = at(layer);
  return l.window.bytes() + (l.compressor ? l.compressor->bytes() : 0) + (l.indexer ? l.indexer->bytes() : 0);
}

void V4Cache::set_length(int64_t seq, int64_t length) {
  R3_CHECK(seq >= 0 && seq < max_seqs_, "cache: seq ", seq, " out of range");
  R3_CHECK(length >= 0 && length <= capacity_, "cache: length ", length, " exceeds capacity ", capacity_, " tokens");
  const auto s = static_cast<std::size_t>(seq);
  if (length == 0) {
    high_water_[s] = 0;
  } else if (length < high_water_[s]) {
    const int64_t newest = high_water_[s] - 1;  // rows up to here have been written since
    for (const Layer& layer : layers_) {
      const int64_t oldest = std::max<int64_t>(0, length - layer.specs.window.window + 1);
      const bool ok = (oldest >= length || layer.window.holds(oldest, newest)) &&
                      (!layer.compressor || layer.compressor->can_resume(length, newest)) &&
                      (!layer.indexer || layer.indexer->can_resume(length, newest));
      R3_CHECK(ok, "cache: cannot shorten seq ", seq, " from ", high_water_[s], " to ", length,
               " positions: its sliding-window or compressor blocks have been reused since");
    }
  }
  high_water_[s] = std::max(high_water_[s], length);
  lengths_[s] = length;
  for (Layer& layer : layers_) {
    if (layer.compressor) layer.compressor->truncate(seq, length);
    if (layer.indexer) layer.indexer->truncate(seq, length);
  }
}

}  // namespace r3::models
