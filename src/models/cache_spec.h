// What one attention layer keeps in the cache for every token position, declared by the layer
// and used by the decoder to build its cache: full K/V rows, K/V rows of which only a sliding
// window is ever read, or multi-head latent attention's latent and rotary key. DeepSeek-V4's
// layers declare several of these streams each: the shared K=V rows of its sliding window, its
// compressors' per-position projections (read only until their window is compressed), and the
// compressed entries (one per window of `rate` positions; the indexer's are its keys). Linear
// attention layers (Kimi Delta Attention) keep no rows at all, but a fixed-size state per
// sequence that every token updates.
#pragma once

#include <cstdint>

namespace r3::models {

struct CacheSpec {
  enum class Kind {
    kFullKv,
    kSlidingWindowKv,
    kLatent,
    kSharedSlidingKv,    // one row per position that is both key and value (V4), window `window`
    kCompressorRows,     // a compressor's projections per position: kv (key_width) and gate (value_width)
    kCompressedEntries,  // one entry of key_width floats per completed window of `rate` positions
    kRecurrentState,     // per sequence, not per position: key_width + value_width floats of state
  };

  Kind kind = Kind::kFullKv;
  // Floats per position: K row and V row (num_kv_heads * head_dim each), or for MLA the
  // normalised latent (kv_lora_rank) and the rotated shared key (qk_rope_head_dim). A value
  // width of 0 means the key row is also the value row (V4's shared K=V, its entries).
  int64_t key_width = 0;
  int64_t value_width = 0;
  // kSlidingWindowKv, kSharedSlidingKv: the token at position p reads positions [p - window + 1, p] only.
  int64_t window = 0;
  // kCompressorRows / kCompressedEntries: positions per window; with overlap, the entry of window
  // w also reads window w-1's rows (so those rows are held for two windows).
  int64_t rate = 0;
  bool overlap = false;

  // kCompressedEntries cost one row per `rate` positions (rounded up to whole bytes per token);
  // kRecurrentState nothing per token (its state is per sequence).
  int64_t bytes_per_token() const {
    const int64_t row = (key_width + value_width) * static_cast<int64_t>(sizeof(float));
    if (kind == Kind::kRecurrentState) return 0;
    return kind == Kind::kCompressedEntries ? (row + rate - 1) / rate : row;
  }

  static CacheSpec full_kv(int64_t row_width) { return {Kind::kFullKv, row_width, row_width, 0}; }
  static CacheSpec sliding_window_kv(int64_t row_width, int64_t window) {
    return {Kind::kSlidingWindowKv, row_width, row_width, window};
  }
  static CacheSpec latent(int64_t kv_lora_rank, int64_t rope_dim) {
    return {Kind::kLatent, kv_lora_rank, rope_dim, 0};
  }
  static CacheSpec shared_sliding_kv(int64_t row_width, int64_t window) {
    return {Kind::kSharedSlidingKv, row_width, 0, window};
  }
  static CacheSpec compressor_rows(int64_t width, int64_t rate, bool overlap) {
    return {Kind::kCompressorRows, width, width, 0, rate, overlap};
  }
  static CacheSpec compressed_entries(int64_t dim, int64_t rate) {
    return {Kind::kCompressedEntries, dim, 0, 0, rate, false};
  }
  // A sequence's state: `first` floats (e.g. convolution state), then `second` (recurrent state).
  static CacheSpec recurrent_state(int64_t first, int64_t second) {
    return {Kind::kRecurrentState, first, second, 0};
  }

  bool operator==(const CacheSpec&) const = default;
};

}  // namespace r3::models
