// The attention ops over a step view (ops/step_view.h) on the CPU, and the one attention class
// they let serve both devices: the step-view ops give the bits of the KvWindow ops whose windows
// they derive, refuse a token without a block (each op by its name), and a grouped-query layer placed with its q, k and
// v stacked (as on a GPU) gives the bits of the layer it came from.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "models/forward_batch.h"
#include "models/gqa_attention.h"
#include "models/kv_cache.h"
#include "ops/attention.h"
#include "ops/kv_write.h"
#include "ops/latent_attention.h"
#include "ops/rotary.h"
#include "test_support.h"

namespace r3::test {
namespace {

using models::ForwardBatch;
using models::KvCache;

std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

Tensor copy_as(const Tensor& t, Shape shape) {
  Tensor out = Tensor::empty(DType::F32, std::move(shape));
  std::copy_n(t.data<float>(), t.numel(), out.data<float>());
  return out;
}

// Three sequences in a shuffled pool: tokens of sequences 0 and 2 at later positions, a padding
// row between them.
struct Step {
  std::vector<int32_t> positions = {9, 10, 0, 4};
  std::vector<int32_t> seqs = {0, 0, ForwardBatch::kPadding, 2};
};

TEST(StepViewAttention, PagedAttentionEqualsTheWindowsItDerivesWithAPaddingRowAndASlidingWindow) {
  const int64_t heads = 4, kv_heads = 2, dim = 8, width = kv_heads * dim;
  KvCache cache({models::CacheSpec::full_kv(width)}, 3, 16, {.block_size = 4, .shuffle_seed = 7});
  const ops::KvPool pool = cache.pool(0);
  const Tensor keys = random_normal({pool.blocks * pool.block_size, width}, 1);
  const Tensor vals = random_normal({pool.blocks * pool.block_size, width}, 2);
  std::copy_n(keys.data<float>(), keys.numel(), static_cast<float*>(pool.keys));
  std::copy_n(vals.data<float>(), vals.numel(), static_cast<float*>(pool.values));
  const Step s;
  ForwardBatch batch;
  batch.token_ids = {1, 2, 3, 4};
  batch.positions = s.positions;
  batch.seqs = s.seqs;
  const ops::StepView step = cache.step_for_layer(batch.view(), 0);
  const Tensor q = random_normal({4, heads, dim}, 3);
  const std::vector<float> sinks = {0.5f, -1.0f, 0.0f, 2.0f};
  backend::Context ctx(2);
  for (const int64_t window : {int64_t{0}, int64_t{3}}) {
    std::vector<ops::KvWindow> windows(4);
    for (std::size_t t = 0; t < 4; ++t) {
      if (s.seqs[t] < 0) continue;
      const int64_t pos = s.positions[t];
      windows[t] = {cache.view(0, s.seqs[t]), window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0, pos + 1};
    }
    Tensor want = Tensor::empty(DType::F32, {4, heads, dim}), got = Tensor::empty(DType::F32, {4, heads, dim});
    ops::attention(ctx, q, windows, kv_heads, 0.35f, want, sinks.data());
    std::fill_n(got.data<float>(), got.numel(), NAN);
    ops::paged_attention(ctx, q, step, pool, kv_heads, 0.35f, window, sinks.data(), got);
    EXPECT_EQ(values(got), values(want)) << "window " << window;
    for (int64_t c = 0; c < heads * dim; ++c) EXPECT_EQ(got.data<float>()[2 * heads * dim + c], 0.0f);  // padding
  }
}

TEST(StepViewAttention, PreparedRowsGoWhereTheWindowOpsWriteThem) {
  const int64_t heads = 4, kv_heads = 2, dim = 8, q_width = heads * dim, width = kv_heads * dim;
  const Step s;
  ForwardBatch batch;
  batch.token_ids = {1, 2, 3, 4};
  batch.positions = s.positions;
  batch.seqs = s.seqs;
  const Tensor q = random_normal({4, q_width}, 4), k = random_normal({4, width}, 5), v = random_normal({4, width}, 6);
  const ops::Rotary rotary(dim, 10000.0);
  backend::Context ctx(2);
  // The window ops: rotate q and k, write k and v through each sequence's view.
  KvCache want_cache({models::CacheSpec::full_kv(width)}, 3, 16, {.block_size = 4, .shuffle_seed = 7});
  Tensor want_q = copy_as(q, {4, heads, dim});
  Tensor want_k = copy_as(k, {4, kv_heads, dim});
  rotary.apply(ctx, want_q, batch.positions);
  rotary.apply(ctx, want_k, batch.positions);
  std::vector<ops::KvWrite> writes(4);
  for (std::size_t t = 0; t < 4; ++t) {
    if (s.seqs[t] >= 0) writes[t] = {want_cache.view(0, s.seqs[t]), s.positions[t]};
  }
  ops::write_kv(ctx, want_k.data<float>(), width, v.data<float>(), width, writes);
  // The step-view op, from rows of a stride wider than theirs (as one stacked projection's).
  KvCache got_cache({models::CacheSpec::full_kv(width)}, 3, 16, {.block_size = 4, .shuffle_seed = 7});
  const int64_t stride = q_width + 2 * width;
  Tensor stacked = Tensor::empty(DType::F32, {4, stride});
  for (int64_t t = 0; t < 4; ++t) {
    std::copy_n(q.data<float>() + t * q_width, q_width, stacked.data<float>() + t * stride);
    std::copy_n(k.data<float>() + t * width, width, stacked.data<float>() + t * stride + q_width);
    std::copy_n(v.data<float>() + t * width, width, stacked.data<float>() + t * stride + q_width + width);
  }
  const float* p = stacked.data<float>();
  const ops::AttentionRows rows{p, stride, p + q_width, stride, p + q_width + width, stride};
  Tensor got_q = Tensor::empty(DType::F32, {4, heads, dim});
  ops::prepare_attention_rows(ctx, rotary, rows, heads, kv_heads, dim, 1e-6f,
                              got_cache.step_for_layer(batch.view(), 0), got_cache.pool(0), got_q);
  EXPECT_EQ(values(got_q), values(want_q));
  const ops::KvPool want_pool = want_cache.pool(0), got_pool = got_cache.pool(0);
  const auto pool_values = [](const ops::KvPool& pool, bool keys) {
    const auto* f = static_cast<const float*>(keys ? pool.keys : pool.values);
    return std::vector<float>(f, f + pool.blocks * pool.block_size * pool.key_width);
  };
  EXPECT_EQ(pool_values(got_pool, true), pool_values(want_pool, true));
  EXPECT_EQ(pool_values(got_pool, false), pool_values(want_pool, false));
}

TEST(StepViewAttention, ATokenWithoutABlockIsRefusedByTheOpThatReachedIt) {
  const int64_t heads = 2, kv_heads = 1, dim = 4, width = kv_heads * dim;
  // Engine-managed: tables start empty, so sequence 1 has no block yet.
  KvCache cache({models::CacheSpec::full_kv(width)}, 2, 16, {.block_size = 4, .pool_blocks = 8});
  ForwardBatch batch;
  batch.token_ids = {1};
  batch.positions = {0};
  batch.seqs = {1};
  const ops::StepView step = cache.step_for_layer(batch.view(), 0);
  backend::Context ctx(1);
  const Tensor q = random_normal({1, heads, dim}, 7), kv = random_normal({1, width}, 8);
  Tensor out = Tensor::empty(DType::F32, {1, heads, dim});
  const auto message = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { ops::paged_attention(ctx, q, step, cache.pool(0), kv_heads, 1.0f, 0, nullptr, out); })
                .find("paged_attention: sequence 1 has no block"),
            std::string::npos);
  const ops::AttentionRows rows{q.data<float>(), heads * dim, kv.data<float>(), width, kv.data<float>(), width};
  Tensor q_out = Tensor::empty(DType::F32, {1, heads, dim});
  EXPECT_NE(message([&] {
              ops::prepare_attention_rows(ctx, ops::Rotary(dim, 10000.0), rows, heads, kv_heads, dim, 1e-6f, step,
                                          cache.pool(0), q_out);
            }).find("prepare_attention_rows: sequence 1 has no block"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops::write_kv_paged(ctx, kv.data<float>(), width, kv.data<float>(), width, step, cache.pool(0));
            }).find("write_kv_paged: sequence 1 has no block"),
            std::string::npos);
  // A latent layer's pool: latents of 4 floats, rotary keys of 2.
  KvCache latent_cache({models::CacheSpec::latent(4, 2)}, 2, 16, {.block_size = 4, .pool_blocks = 8});
  const Tensor latent_q = random_normal({1, 1 * (2 + 2)}, 9), kv_b = random_normal({1 * (2 + 3), 4}, 10);
  Tensor latent_out = Tensor::empty(DType::F32, {1, 3});
  EXPECT_NE(message([&] {
              ops::latent_attention_paged(ctx, latent_q, kv_b, latent_cache.step_for_layer(batch.view(), 0),
                                          latent_cache.pool(0), {1, 2, 2, 3, 4}, 1.0f, latent_out);
            }).find("latent_attention_paged: sequence 1 has no block"),
            std::string::npos);
}

// A grouped-query layer with per-head q/k norms and q/k/v biases (Qwen2-style biases, Qwen3-style
// norms), and the same layer placed on a CPU context: q, k and v stacked into one projection, the
// norms run by the op after it, as on a GPU. Both run the same steps over caches of their own.
TEST(StepViewAttention, AGroupedQueryLayerPlacedWithStackedProjectionsGivesTheSameBits) {
  const int64_t hidden = 32, heads = 4, kv_heads = 2, dim = 8;
  models::AttentionSpec spec;
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = dim;
  spec.qk_norm = models::QkNorm::kPerHead;
  models::GqaAttentionWeights w;
  w.q = random_normal({heads * dim, hidden}, 11);
  w.k = random_normal({kv_heads * dim, hidden}, 12);
  w.v = random_normal({kv_heads * dim, hidden}, 13);
  w.o = random_normal({hidden, heads * dim}, 14);
  w.q_bias = random_normal({heads * dim}, 15);
  w.v_bias = random_normal({kv_heads * dim}, 16);  // k has none: zeros in the stacked bias
  w.q_norm = random_normal({dim}, 17);
  w.k_norm = random_normal({dim}, 18);
  const models::GqaAttention host(spec, 1e-6f, w, ops::Rotary(dim, 10000.0), 0);
  backend::Context ctx(2);
  const std::unique_ptr<models::AttentionLayer> placed = host.placed(ctx, DType::F32);
  const auto& placed_gqa = dynamic_cast<const models::GqaAttention&>(*placed);
  ASSERT_TRUE(placed_gqa.weights().qkv.defined());
  EXPECT_FALSE(placed_gqa.weights().q.defined());
  KvCache host_cache({host.cache_spec()}, 2, 32, {.block_size = 4, .shuffle_seed = 3});
  KvCache placed_cache({placed->cache_spec()}, 2, 32, {.block_size = 4, .shuffle_seed = 3});
  // A prefill of two sequences with a padding row, then two decode steps.
  const std::vector<ForwardBatch> steps = [] {
    std::vector<ForwardBatch> s(3);
    s[0].positions = {0, 1, 2, 0, 0, 1, 2, 3, 4};
    s[0].seqs = {0, 0, 0, ForwardBatch::kPadding, 1, 1, 1, 1, 1};
    s[1].positions = {3, 5};
    s[1].seqs = {0, 1};
    s[2].positions = {6, 4};
    s[2].seqs = {1, 0};
    for (ForwardBatch& b : s) b.token_ids.assign(b.positions.size(), 0);
    return s;
  }();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const int64_t tokens = steps[i].size();
    const Tensor x = random_normal({tokens, hidden}, 20 + static_cast<uint32_t>(i));
    Tensor want = Tensor::empty(DType::F32, {tokens, hidden}), got = Tensor::empty(DType::F32, {tokens, hidden});
    host.forward(ctx, x, steps[i].view(), host_cache, 0, want);
    placed->forward(ctx, x, steps[i].view(), placed_cache, 0, got);
    EXPECT_EQ(values(got), values(want)) << "step " << i;
    for (float f : values(got)) ASSERT_TRUE(std::isfinite(f));
    for (std::size_t t = 0; t < steps[i].seqs.size(); ++t) {
      if (steps[i].seqs[t] < 0) continue;
      host_cache.set_length(steps[i].seqs[t], steps[i].positions[t] + 1);
      placed_cache.set_length(steps[i].seqs[t], steps[i].positions[t] + 1);
    }
  }
}

}  // namespace
}  // namespace r3::test
