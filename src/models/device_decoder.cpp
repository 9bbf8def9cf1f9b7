// place_on_device in a build without the CUDA backend (models/cuda/device_decoder.cpp has the real one).
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

#if !R3_WITH_CUDA
namespace r3::models {

int64_t graph_replays(const CausalLM& model) {
  (void)model;
  return 0;
}

StepGraphNodes step_graph_nodes(const CausalLM& model) {
  (void)model;
  return {};
}

void set_capture_routing(CausalLM& model, bool on) {
  (void)model;
  (void)on;
  R3_FAIL("capture on/off: not a device model (this build of r3 has no CUDA backend)");
}

std::unique_ptr<CausalLM> synthetic_on_device(backend::Context& ctx, const SyntheticShape& shape, uint64_t seed,
                                              bool capture_routing) {
  (void)ctx;
  (void)shape;
  (void)seed;
  (void)capture_routing;
  R3_FAIL("--synthetic: this build of r3 has no CUDA backend");
}

void set_moe_path(CausalLM& model, moe::MoePath path) {
  (void)model;
  (void)path;
  R3_FAIL("--moe-path: this build of r3 has no CUDA backend");
}

std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model, DType weights,
                                          moe::MoePath moe_path, moe::ExpertSlice experts) {
  (void)experts;
  (void)ctx;
  (void)model;
  (void)weights;
  (void)moe_path;
  R3_FAIL("--device cuda: this build of r3 has no CUDA backend (nvcc was not found when it was built)");
}

}  // namespace r3::models
#endif
