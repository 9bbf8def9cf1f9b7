// The paged KV cache: block-table addressing, sliding-window rings, and attention through the
// paged view. A model run whose blocks are scattered across the pool (a shuffled free list,
// blocks of all sequences interleaved, blocks as small as one position) must give logits and
// routed experts bit-identical to the contiguous assignment, for GQA, sliding-window and MLA
// layers, over a batched prefill, multi-token chunks and single-token decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "engine/step_runner.h"
#include "models/decoder_model.h"
#include "models/kv_cache.h"
#include "models/registry.h"
#include "ops/attention.h"
#include "test_support.h"

namespace r3::test {
namespace {

using models::CacheSpec;
using models::KvCache;
using models::KvCacheOptions;

// ---------------------------------------------------------------------------------------------
// Addressing.

TEST(PagedKv, BlockTablesAddressEveryPositionOfEverySlotThroughScatteredBlocks) {
  const std::vector<CacheSpec> specs = {CacheSpec::full_kv(4), CacheSpec::sliding_window_kv(4, 3),
                                        CacheSpec::latent(5, 2)};
  const int64_t seqs = 3, capacity = 10, block = 2;
  KvCache cache(specs, seqs, capacity, {block, /*shuffle_seed=*/11});
  KvCache contiguous(specs, seqs, capacity, {block, 0});
  EXPECT_EQ(cache.bytes_per_token(), (8 + 8 + 7) * 4);

  for (int64_t layer : {0, 2}) {  // full layers: every sequence owns ceil(10 / 2) = 5 distinct blocks
    EXPECT_EQ(cache.blocks_per_seq(layer), 5);
    EXPECT_EQ(cache.positions_per_pass(layer), capacity);
    std::vector<int32_t> all;
    for (int64_t s = 0; s < seqs; ++s) {
      const auto table = cache.block_table(layer, s);
      ASSERT_EQ(table.size(), 5u);
      all.insert(all.end(), table.begin(), table.end());
      // The contiguous assignment gives sequence s blocks [5s, 5s + 5) in order.
      const auto plain = contiguous.block_table(layer, s);
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(plain[static_cast<std::size_t>(i)], 5 * s + i);
    }
    std::vector<int32_t> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int32_t> ids(15);
    std::iota(ids.begin(), ids.end(), 0);
    EXPECT_EQ(sorted, ids) << "each block belongs to exactly one seq";
    EXPECT_NE(all, ids) << "the shuffled free list must scatter the blocks";
  }

  // Write a distinct row at every (layer, sequence, position) through the view, then read it back
  // through the view and straight from the pool at table[p / B] * B + p % B.
  auto tag = [](int64_t layer, int64_t seq, int64_t p, int64_t c) {
    return static_cast<float>(10000 * layer + 1000 * seq + 10 * p + c);
  };
  for (int64_t layer : {0, 2}) {
    for (int64_t s = 0; s < seqs; ++s) {
      const ops::PagedKv kv = cache.view(layer, s);
      for (int64_t p = 0; p < capacity; ++p) {
        for (int64_t c = 0; c < kv.key_width; ++c) kv.key_row(p)[c] = tag(layer, s, p, c);
        for (int64_t c = 0; c < kv.value_width; ++c) kv.value_row(p)[c] = -tag(layer, s, p, c);
      }
    }
    for (int64_t s = 0; s < seqs; ++s) {
      const ops::PagedKv kv = cache.view(layer, s);
      const auto table = cache.block_table(layer, s);
      for (int64_t p = 0; p < capacity; ++p) {
        const int64_t row = table[static_cast<std::size_t>(p / block)] * block + p % block;
        for (int64_t c = 0; c < kv.key_width; ++c) {
          EXPECT_EQ(kv.key_row(p)[c], tag(layer, s, p, c));
          EXPECT_EQ(kv.keys[row * kv.key_width + c], tag(layer, s, p, c));
        }
        for (int64_t c = 0; c < kv.value_width; ++c) EXPECT_EQ(kv.values[row * kv.value_width + c], -tag(layer, s, p, c));
      }
      // Runs of one block each, in order, covering the range.
      std::vector<int64_t> seen;
      kv.for_each_run(1, 8, [&](int64_t first, int64_t n, const float* keys, const float*) {
        EXPECT_LE(n, block);
        EXPECT_EQ(keys, kv.key_row(first));
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(keys[i * kv.key_width], tag(layer, s, first + i, 0));
          seen.push_back(first + i);
        }
      });
      EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
    }
  }
}

TEST(PagedKv, SlidingWindowLayersHoldARingOfBlocksCoveringTheWindow) {
  // Window 5, blocks of 2: a pass writes at most 2 positions ahead, so the token at p needs
  // blocks from (p - 4) / 2 to (p + 1) / 2: at most ceil((5 + 2 - 2) / 2) + 1 = 4 blocks.
  const std::vector<CacheSpec> specs = {CacheSpec::sliding_window_kv(3, 5), CacheSpec::full_kv(3)};
  const int64_t seqs = 2, capacity = 20, block = 2;
  KvCache cache(specs, seqs, capacity, {block, 5});
  EXPECT_EQ(cache.blocks_per_seq(0), 4);
  EXPECT_EQ(cache.blocks_per_seq(1), 10);
  EXPECT_EQ(cache.positions_per_pass(0), block);
  EXPECT_EQ(cache.pool_bytes(), seqs * (4 + 10) * block * 2 * 3 * 4);
  std::set<int32_t> owned[2];
  for (int64_t s = 0; s < seqs; ++s) {
    const auto table = cache.block_table(0, s);
    ASSERT_EQ(table.size(), 10u);
    for (std::size_t i = 0; i < table.size(); ++i) EXPECT_EQ(table[i], table[i % 4]) << "a ring of 4 blocks";
    owned[s].insert(table.begin(), table.end());
    EXPECT_EQ(owned[s].size(), 4u);
  }
  for (int32_t b : owned[0]) EXPECT_EQ(owned[1].count(b), 0u) << "seqs never share ring blocks";

  // Writing positions in order, each pass of `block` positions ahead, never clobbers a position
  // some token of the pass still reads (its last 5).
  ops::PagedKv kv = cache.view(0, 1);
  for (int64_t first = 0; first < capacity; first += block) {
    for (int64_t p = first; p < first + block; ++p) kv.key_row(p)[0] = static_cast<float>(p);
    for (int64_t p = first; p < first + block; ++p) {
      for (int64_t q = std::max<int64_t>(0, p - 4); q <= p; ++q) EXPECT_EQ(kv.key_row(q)[0], q) << p;
    }
  }
  // Ring blocks have been reused: shortening below what the window still holds is refused,
  // clearing is always allowed, and the sequence can be filled again.
  cache.set_length(1, capacity);
  EXPECT_THROW(cache.set_length(1, 4), Error);
  EXPECT_NO_THROW(cache.set_length(1, capacity - 1));
  EXPECT_NO_THROW(cache.clear(1));
  EXPECT_NO_THROW(cache.set_length(1, 4));
  // A window wider than the capacity needs no ring.
  KvCache wide({CacheSpec::sliding_window_kv(3, 64)}, 1, 20, {4, 0});
  EXPECT_EQ(wide.blocks_per_seq(0), 5);
  EXPECT_EQ(wide.positions_per_pass(0), 20);
}

TEST(PagedKv, AttentionThroughAScatteredBlockTableEqualsContiguousRows) {
  const int64_t heads = 4, kv_heads = 2, dim = 8, len = 11, width = kv_heads * dim, block = 3;
  Tensor q = random_normal({3, heads, dim}, 1);
  Tensor keys = random_normal({len, width}, 2), vals = random_normal({len, width}, 3);
  // Contiguous: one block holding all rows. Paged: 4 blocks of 3 placed in a pool of 6 blocks
  // in the order 4, 0, 5, 2 (the other blocks hold garbage that must never be read).
  const std::vector<int32_t> one = {0};
  const ops::PagedKv plain{keys.data<float>(), vals.data<float>(), width, width, len, one};
  const std::vector<int32_t> table = {4, 0, 5, 2};
  std::vector<float> pool_k(6 * block * width, NAN), pool_v(6 * block * width, NAN);
  for (int64_t p = 0; p < len; ++p) {
    const int64_t row = table[static_cast<std::size_t>(p / block)] * block + p % block;
    std::copy_n(keys.data<float>() + p * width, width, pool_k.data() + row * width);
    std::copy_n(vals.data<float>() + p * width, width, pool_v.data() + row * width);
  }
  const ops::PagedKv paged{pool_k.data(), pool_v.data(), width, width, block, table};
  // Full prefix, a window starting mid-block, a single row.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 11}, {4, 10}, {7, 8}};
  const std::vector<float> sinks = {0.5f, -1.0f, 0.0f, 2.0f};
  for (const float* s : {static_cast<const float*>(nullptr), sinks.data()}) {
    std::vector<ops::KvWindow> want_rows, got_rows;
    for (auto [b, e] : ranges) {
      want_rows.push_back({plain, b, e});
      got_rows.push_back({paged, b, e});
    }
    backend::Context ctx(3);
    Tensor want = Tensor::empty(DType::F32, {3, heads, dim}), got = Tensor::empty(DType::F32, {3, heads, dim});
    ops::attention(ctx, q, want_rows, kv_heads, 0.35f, want, s);
    ops::attention(ctx, q, got_rows, kv_heads, 0.35f, got, s);
    const std::vector<float> w(want.data<float>(), want.data<float>() + want.numel());
    const std::vector<float> g(got.data<float>(), got.data<float>() + got.numel());
    EXPECT_EQ(g, w);
    for (float x : g) EXPECT_TRUE(std::isfinite(x));
    // And against a double-precision loop over the same rows.
    for (std::size_t t = 0; t < ranges.size(); ++t) {
      const auto [b, e] = ranges[t];
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / (heads / kv_heads);
        std::vector<double> sc;
        double mx = s ? s[h] : -1e300;
        for (int64_t p = b; p < e; ++p) {
          double d = 0;
          for (int64_t c = 0; c < dim; ++c) {
            d += double(q.data<float>()[(int64_t(t) * heads + h) * dim + c]) * keys.data<float>()[p * width + kvh * dim + c];
          }
          sc.push_back(d * 0.35);
          mx = std::max(mx, sc.back());
        }
        double denom = s ? std::exp(s[h] - mx) : 0.0;
        for (double& x : sc) denom += (x = std::exp(x - mx));
        for (int64_t c = 0; c < dim; ++c) {
          double o = 0;
          for (int64_t p = b; p < e; ++p) o += sc[static_cast<std::size_t>(p - b)] / denom * vals.data<float>()[p * width + kvh * dim + c];
          EXPECT_NEAR(g[static_cast<std::size_t>((int64_t(t) * heads + h) * dim + c)], o, 1e-5);
        }
      }
    }
  }
  // A view whose table does not reach the last position, or of the wrong width, is refused.
  backend::Context ctx(1);
  Tensor out = Tensor::empty(DType::F32, {1, heads, dim});
  Tensor q1 = random_normal({1, heads, dim}, 4);
  EXPECT_THROW(ops::attention(ctx, q1, std::vector<ops::KvWindow>{{paged, 0, 13}}, kv_heads, 1.0f, out), Error);
  const ops::PagedKv narrow{pool_k.data(), pool_v.data(), dim, dim, block, table};
  EXPECT_THROW(ops::attention(ctx, q1, std::vector<ops::KvWindow>{{narrow, 0, 2}}, kv_heads, 1.0f, out), Error);
}

// ---------------------------------------------------------------------------------------------
// Whole models: scattered blocks against the contiguous assignment.

struct Run {
  std::vector<std::vector<float>> logits;  // per step, every row
  std::vector<std::vector<int32_t>> routed;  // per sequence, all rows
  std::vector<float> seq0_logits;          // the rows of sequence 0 in order, [tokens, vocab]
};

// Three sequences sharing steps: a batched prefill of two prompts with a padding row, then a
// multi-token chunk, a third sequence joining late, and single-token decode steps, until sequence 0
// has run over ids0[0, 19).
Run run_schedule(models::DecoderModel& model, KvCacheOptions options, const std::vector<int32_t>& ids0,
                 const std::vector<int32_t>& ids1) {
  backend::Context ctx(2);
  const int64_t capacity = 24;
  auto cache = model.make_kv_cache(3, capacity, options);
  engine::StepRunner runner(model, ctx, *cache, 32);
  const auto& info = model.info();
  const auto layers = static_cast<int64_t>(info.moe_layers.size());
  std::vector<engine::RoutedExperts> routed(3, engine::RoutedExperts(layers, info.top_k));
  std::vector<int32_t> ids2(ids1.rbegin(), ids1.rend());
  EXPECT_GE(ids0.size(), 19u);
  EXPECT_GE(ids1.size(), 17u);
  std::vector<std::size_t> done(3, 0);
  Run run;
  const std::vector<std::vector<std::pair<int32_t, std::size_t>>> schedule = {
      {{0, 12}, {1, 7}},          // prefill
      {{1, 5}, {0, 1}},           // a chunk of 5 for sequence 1 before sequence 0's token
      {{0, 1}, {2, 9}, {1, 1}},   // sequence 2 joins
      {{0, 1}, {1, 1}, {2, 1}}, {{2, 3}, {0, 1}}, {{0, 1}, {1, 2}}, {{0, 1}}, {{0, 1}, {1, 1}, {2, 1}}};
  const std::vector<const std::vector<int32_t>*> source = {&ids0, &ids1, &ids2};
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    std::vector<engine::StepSequence> step;
    std::vector<std::size_t> seq0_rows;
    int64_t row = 0;
    for (auto [seq, n] : schedule[s]) {
      const auto& src = *source[static_cast<std::size_t>(seq)];
      if (done[seq] + n > src.size()) throw Error("test schedule runs past its tokens");
      std::vector<int32_t> tokens(src.begin() + static_cast<std::ptrdiff_t>(done[seq]),
                                  src.begin() + static_cast<std::ptrdiff_t>(done[seq] + n));
      if (seq == 0) {
        for (std::size_t i = 0; i < n; ++i) seq0_rows.push_back(static_cast<std::size_t>(row) + i);
      }
      row += static_cast<int64_t>(n);
      done[seq] += n;
      step.push_back({seq, std::move(tokens), &routed[static_cast<std::size_t>(seq)], {}});
    }
    const Tensor logits = runner.run(step, /*padding_rows=*/s == 0 ? 1 : 0, /*all_logits=*/true);
    const int64_t v = logits.dim(1);
    run.logits.emplace_back(logits.data<float>(), logits.data<float>() + logits.numel());
    for (std::size_t r : seq0_rows) {
      const float* p = logits.data<float>() + static_cast<int64_t>(r) * v;
      run.seq0_logits.insert(run.seq0_logits.end(), p, p + v);
    }
  }
  EXPECT_EQ(done[0], 19u);
  EXPECT_EQ(cache->length(0), 19);
  EXPECT_EQ(cache->length(1), 17);
  EXPECT_EQ(cache->length(2), 14);
  for (const auto& r : routed) run.routed.push_back(r.flat());
  return run;
}

std::vector<int32_t> reference_ids(const std::string& family, int index) {
  const Reference ref = load_reference(family, index);
  return {ref.input_ids.begin(), ref.input_ids.end()};
}

// Slots 1 and 2 run other tokens: the second reference sequence, then the first one reversed.
std::vector<int32_t> second_sequence(const std::string& family) {
  std::vector<int32_t> ids = reference_ids(family, 1);
  const std::vector<int32_t> first = reference_ids(family, 0);
  ids.insert(ids.end(), first.rbegin(), first.rend());
  return ids;
}

// Slot 0 ran exactly the reference forward (ids[0, 19)): its logits and routing must match the
// float64 reference as in the parity tests, whatever the block layout.
void expect_matches_reference(const std::string& family, const Run& run, const std::string& what) {
  const Reference ref = load_reference(family, 0);
  ASSERT_EQ(run.seq0_logits.size(), ref.logits.size()) << what;
  double max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < ref.logits.size(); ++i) {
    max_err = std::max(max_err, std::abs(double(run.seq0_logits[i]) - ref.logits[i]));
    max_ref = std::max(max_ref, std::abs(ref.logits[i]));
  }
  EXPECT_LE(max_err / max_ref, 1e-4) << what;
  const auto& got = run.routed[0];
  ASSERT_EQ(got.size(), ref.topk_ids.size()) << what;
  const auto k = static_cast<std::size_t>(ref.top_k);
  for (std::size_t r = 0; r < got.size(); r += k) {
    const std::set<int64_t> a(got.begin() + static_cast<std::ptrdiff_t>(r), got.begin() + static_cast<std::ptrdiff_t>(r + k));
    const std::set<int64_t> b(ref.topk_ids.begin() + static_cast<std::ptrdiff_t>(r),
                              ref.topk_ids.begin() + static_cast<std::ptrdiff_t>(r + k));
    EXPECT_EQ(a, b) << what << " routing row " << r / k;
  }
}

void expect_scattered_blocks_change_nothing(const std::string& family, const std::string& dir,
                                            bool has_reference) {
  auto owner = models::load_model(dir);
  auto* model = dynamic_cast<models::DecoderModel*>(owner.get());
  ASSERT_NE(model, nullptr) << family;
  const auto ids0 = reference_ids(family, 0), ids1 = second_sequence(family);
  const Run contiguous = run_schedule(*model, {16, 0}, ids0, ids1);
  if (has_reference) expect_matches_reference(family, contiguous, family + " contiguous");
  for (const KvCacheOptions options : {KvCacheOptions{16, 3}, KvCacheOptions{4, 7}, KvCacheOptions{2, 9},
                                       KvCacheOptions{1, 13}, KvCacheOptions{5, 0}}) {
    const std::string what = family + " blocks of " + std::to_string(options.block_size) + " seed " +
                             std::to_string(options.shuffle_seed);
    // The cache really is scattered: a sequence's blocks are not consecutive in the pool.
    auto probe = model->make_kv_cache(3, 24, options);
    if (options.shuffle_seed != 0 && probe->blocks_per_seq(0) > 1) {
      const auto table = probe->block_table(0, 0);
      bool consecutive = true;
      for (std::size_t i = 1; i < static_cast<std::size_t>(probe->blocks_per_seq(0)); ++i) {
        consecutive = consecutive && table[i] == table[i - 1] + 1;
      }
      EXPECT_FALSE(consecutive) << what;
    }
    const Run got = run_schedule(*model, options, ids0, ids1);
    ASSERT_EQ(got.logits.size(), contiguous.logits.size()) << what;
    for (std::size_t s = 0; s < got.logits.size(); ++s) EXPECT_EQ(got.logits[s], contiguous.logits[s]) << what << " step " << s;
    EXPECT_EQ(got.routed, contiguous.routed) << what;
    if (has_reference) expect_matches_reference(family, got, what);
  }
}

TEST(PagedKv, GroupedQueryAttentionModelIsBitIdenticalWithScatteredBlocks) {
  expect_scattered_blocks_change_nothing("qwen3_moe", family_dir("qwen3_moe"), true);
}

TEST(PagedKv, SlidingWindowModelIsBitIdenticalWithScatteredBlocksAndRings) {
  // GPT-OSS: sliding-window (8) and full layers alternate; with blocks of 1, 2 and 4 the
  // sliding layers hold rings shorter than the sequences, and still match the reference.
  auto owner = models::load_model(family_dir("gpt_oss"));
  auto* model = dynamic_cast<models::DecoderModel*>(owner.get());
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->cache_specs()[0], CacheSpec::sliding_window_kv(2 * 16, 8));
  ASSERT_EQ(model->cache_specs()[1], CacheSpec::full_kv(2 * 16));
  auto cache = model->make_kv_cache(3, 24, {2, 0});
  EXPECT_EQ(cache->blocks_per_seq(0), 5);  // ceil((8 + 2 - 2) / 2) + 1, not 12
  EXPECT_EQ(cache->blocks_per_seq(1), 12);
  expect_scattered_blocks_change_nothing("gpt_oss", family_dir("gpt_oss"), true);
}

TEST(PagedKv, MixtralWithASlidingWindowIsBitIdenticalWithScatteredBlocks) {
  // The fixture has no window; a copy with window 5 on every layer (no reference: compared with
  // its own contiguous run, which differs from the windowless model's).
  TempDir dir;
  const std::string windowed = copy_model_with_config("mixtral", dir, "mixtral", "sliding_window", "5");
  auto owner = models::load_model(windowed);
  auto* model = dynamic_cast<models::DecoderModel*>(owner.get());
  ASSERT_NE(model, nullptr);
  for (const CacheSpec& spec : model->cache_specs()) EXPECT_EQ(spec, CacheSpec::sliding_window_kv(2 * 16, 5));
  expect_scattered_blocks_change_nothing("mixtral", windowed, false);
  auto plain_owner = models::load_model(family_dir("mixtral"));
  auto* plain = dynamic_cast<models::DecoderModel*>(plain_owner.get());
  ASSERT_NE(plain, nullptr);
  const auto ids0 = reference_ids("mixtral", 0), ids1 = second_sequence("mixtral");
  EXPECT_NE(run_schedule(*model, {16, 0}, ids0, ids1).seq0_logits,
            run_schedule(*plain, {16, 0}, ids0, ids1).seq0_logits)
      << "a window of 5 over 19 tokens must change the result";
  expect_scattered_blocks_change_nothing("mixtral", family_dir("mixtral"), true);
}

TEST(PagedKv, LatentAttentionModelIsBitIdenticalWithScatteredBlocks) {
  auto owner = models::load_model(family_dir("deepseek_v3"));
  auto* model = dynamic_cast<models::DecoderModel*>(owner.get());
  ASSERT_NE(model, nullptr);
  for (const CacheSpec& spec : model->cache_specs()) EXPECT_EQ(spec, CacheSpec::latent(16, 8));
  expect_scattered_blocks_change_nothing("deepseek_v3", family_dir("deepseek_v3"), true);
}

TEST(PagedKv, ACacheOfOtherSpecsIsRefused) {
  auto owner = models::load_model(family_dir("qwen3_moe"));
  KvCache wrong({CacheSpec::latent(16, 8), CacheSpec::latent(16, 8), CacheSpec::latent(16, 8)}, 1, 8);
  backend::Context ctx(1);
  EXPECT_THROW(owner->forward(ctx, models::ForwardBatch::sequence({1, 2}, 0), wrong), Error);
}

}  // namespace
}  // namespace r3::test
