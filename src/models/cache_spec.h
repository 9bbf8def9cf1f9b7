// What one attention layer keeps in the cache for every token position, declared by the layer
// and used by the decoder to build its cache: full K/V rows, K/V rows of which only a sliding
// window is ever read, or multi-head latent attention's latent and rotary key.
#pragma once

#include <cstdint>

namespace r3::models {

struct CacheSpec {
  enum class Kind { kFullKv, kSlidingWindowKv, kLatent };

  Kind kind = Kind::kFullKv;
  // Floats per position: K row and V row (num_kv_heads * head_dim each), or for MLA the
  // normalised latent (kv_lora_rank) and the rotated shared key (qk_rope_head_dim).
  int64_t key_width = 0;
  int64_t value_width = 0;
  // kSlidingWindowKv: the token at position p reads positions [p - window + 1, p] only.
  int64_t window = 0;

  int64_t bytes_per_token() const { return (key_width + value_width) * static_cast<int64_t>(sizeof(float)); }

  static CacheSpec full_kv(int64_t row_width) { return {Kind::kFullKv, row_width, row_width, 0}; }
  static CacheSpec sliding_window_kv(int64_t row_width, int64_t window) {
    return {Kind::kSlidingWindowKv, row_width, row_width, window};
  }
  static CacheSpec latent(int64_t kv_lora_rank, int64_t rope_dim) {
    return {Kind::kLatent, kv_lora_rank, rope_dim, 0};
  }

  bool operator==(const CacheSpec&) const = default;
};

}  // namespace r3::models
