// SyntheticShape (models/device_decoder.h): the synthetic benchmark model's sizes, on every build.
#include "models/device_decoder.h"

namespace r3::models {

SyntheticShape SyntheticShape::named(std::string_view name) {
  R3_CHECK(name == "qwen3-30b-a3b", "unknown synthetic model '", name, "' (known: qwen3-30b-a3b)");
  return {};
}

int64_t SyntheticShape::matrix_bytes(int64_t rows, int64_t cols) const {
  if (!fp8) return 2 * rows * cols;
  const auto blocks = [](int64_t n) { return (n + kFp8Block - 1) / kFp8Block; };
  return rows * cols + 4 * blocks(rows) * blocks(cols);
}

int64_t SyntheticShape::weight_bytes() const {
  const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  const int64_t attention = matrix_bytes(q_width + 2 * kv_width, hidden) + matrix_bytes(hidden, q_width);
  const int64_t per_layer = attention + experts * (2 * matrix_bytes(expert_width, hidden) + matrix_bytes(hidden, expert_width)) +
                            4 * (experts * hidden + 2 * hidden);
  return layers * per_layer + 2 * 2 * vocab * hidden + 4 * hidden;
}

int64_t SyntheticShape::kv_cache_bytes(int64_t sequences, int64_t positions) const {
  return layers * sequences * positions * 2 * kv_heads * head_dim * 2;  // keys and values, bf16
}

BatchesThatFit batches_that_fit(const SyntheticShape& shape, const std::vector<int64_t>& batches, int64_t context,
                                int64_t free_bytes) {
  BatchesThatFit out;
  for (const int64_t batch : batches) {
    const bool fits = shape.kv_cache_bytes(batch, context + kSyntheticSparePositions) + kSyntheticStepMargin <= free_bytes;
    (fits ? out.run : out.skipped).push_back(batch);
  }
  return out;
}

}  // namespace r3::models
