// DeepSeek-V4 on the paged cache: its streams (sliding K=V rows, compressor projections,
// compressed entries, indexer keys) live in fixed-size blocks behind block tables. Scattered
// blocks must change no bit of the logits or routing, over chunked prefill, several sequences
// and decode; ring streams must not grow with the capacity; shortening a sequence must resume
// exactly, or be refused when a ring has dropped what the next token needs. Also the kernels'
// paged views, and the Sinkhorn mixing op against plain loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>

#include "core/check.h"
#include "engine/step_runner.h"
#include "models/deepseek_v4/deepseek_v4_model.h"
#include "models/registry.h"
#include "ops/lightning_indexer.h"
#include "ops/sinkhorn.h"
#include "ops/window_pool.h"
#include "test_support.h"

namespace r3::test {
namespace {

using models::CacheSpec;
using models::V4Cache;
using models::V4CacheOptions;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int32_t> v4_reference_ids(const std::string& family, int index) {
  const Reference ref = load_reference(family, index);
  return {ref.input_ids.begin(), ref.input_ids.end()};
}

struct V4Model {
  std::unique_ptr<models::CausalLM> owner;
  models::DeepseekV4Model* model = nullptr;
  models::DeepseekV4Spec spec;
};

V4Model load_v4(const std::string& family) {
  V4Model m;
  m.owner = models::load_model(family_dir(family));
  m.model = dynamic_cast<models::DeepseekV4Model*>(m.owner.get());
  std::ifstream in(family_dir(family) + "/config.json");
  m.spec = models::DeepseekV4Spec::parse(HfConfig::parse(std::string(std::istreambuf_iterator<char>(in), {})));
  return m;
}

// ---------------------------------------------------------------------------------------------
// Whole models: scattered blocks and rings against one block per sequence (the unpaged layout).

struct V4Run {
  std::vector<std::vector<float>> logits;    // per step, every row
  std::vector<std::vector<int32_t>> routed;  // per sequence
};

// Three sequences sharing steps: sequence 0's prompt in two chunks (`first` and `second` tokens, which
// the caller picks to cross compressor windows), sequence 1 in chunks around it, sequence 2 joining
// late, then single-token decode steps.
V4Run run_v4_schedule(models::DeepseekV4Model& model, int64_t capacity, V4CacheOptions options, int64_t first,
                 int64_t second, const std::vector<int32_t>& ids0, const std::vector<int32_t>& ids1) {
  backend::Context ctx(2);
  auto cache = model.make_v4_cache(3, capacity, options);
  engine::StepRunner runner(model, ctx, *cache, first + second + 16);
  const auto& info = model.info();
  std::vector<engine::RoutedExperts> routed(3, engine::RoutedExperts(static_cast<int64_t>(info.moe_layers.size()),
                                                                     info.top_k));
  const std::vector<int32_t> ids2(ids1.rbegin(), ids1.rend());
  const std::vector<const std::vector<int32_t>*> source = {&ids0, &ids1, &ids2};
  const std::vector<std::vector<std::pair<int32_t, int64_t>>> schedule = {
      {{0, first}, {1, 7}},  // prefill
      {{1, 5}, {0, second}},
      {{0, 1}, {2, 9}, {1, 1}},  // sequence 2 joins
      {{0, 1}, {1, 1}, {2, 1}}, {{2, 3}, {0, 1}}, {{0, 1}, {1, 2}}, {{0, 1}}, {{0, 1}, {1, 1}, {2, 1}}};
  std::vector<int64_t> done(3, 0);
  V4Run run;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    std::vector<engine::StepSequence> step;
    for (auto [seq, n] : schedule[s]) {
      const auto& src = *source[static_cast<std::size_t>(seq)];
      if (done[seq] + n > static_cast<int64_t>(src.size())) throw Error("test schedule runs past its tokens");
      std::vector<int32_t> tokens(src.begin() + done[seq], src.begin() + done[seq] + n);
      done[seq] += n;
      step.push_back({seq, std::move(tokens), &routed[static_cast<std::size_t>(seq)], {}});
    }
    const Tensor logits = runner.run(step, /*padding_rows=*/s == 0 ? 1 : 0, /*all_logits=*/true);
    run.logits.emplace_back(logits.data<float>(), logits.data<float>() + logits.numel());
  }
  for (int32_t seq = 0; seq < 3; ++seq) EXPECT_EQ(cache->length(seq), done[seq]);
  for (const auto& r : routed) run.routed.push_back(r.flat());
  return run;
}

void v4_expect_scattered_blocks_change_nothing(const std::string& family, int64_t capacity, int64_t first,
                                            int64_t second) {
  V4Model m = load_v4(family);
  ASSERT_NE(m.model, nullptr) << family;
  const auto ids0 = v4_reference_ids(family, 0);
  std::vector<int32_t> ids1 = v4_reference_ids(family, 1);
  ids1.insert(ids1.end(), ids0.rbegin(), ids0.rend());
  // One block per sequence: every stream is contiguous and nothing is a ring.
  const V4CacheOptions whole{capacity, 0};
  const V4Run contiguous = run_v4_schedule(*m.model, capacity, whole, first, second, ids0, ids1);
  bool some_ring = false, some_scattered = false;
  for (const V4CacheOptions options : {V4CacheOptions{16, 0}, V4CacheOptions{16, 3}, V4CacheOptions{4, 7},
                                       V4CacheOptions{2, 9}, V4CacheOptions{1, 13}, V4CacheOptions{5, 0}}) {
    const std::string what = family + " blocks of " + std::to_string(options.block_size) + " seed " +
                             std::to_string(options.shuffle_seed);
    auto probe = m.model->make_v4_cache(3, capacity, options);
    for (int64_t l = 0; l < probe->num_layers(); ++l) {
      const models::PagedRows& window = probe->window(l);
      some_ring = some_ring || window.is_ring();
      if (probe->compressor(l)) some_ring = some_ring || probe->compressor(l)->rows().is_ring();
      const auto table = probe->compressor(l) ? probe->compressor(l)->entries().block_table(0) : window.block_table(0);
      for (std::size_t i = 1; i < table.size(); ++i) some_scattered = some_scattered || table[i] != table[i - 1] + 1;
    }
    const V4Run got = run_v4_schedule(*m.model, capacity, options, first, second, ids0, ids1);
    ASSERT_EQ(got.logits.size(), contiguous.logits.size()) << what;
    for (std::size_t s = 0; s < got.logits.size(); ++s) EXPECT_EQ(got.logits[s], contiguous.logits[s]) << what << " step " << s;
    EXPECT_EQ(got.routed, contiguous.routed) << what;
  }
  EXPECT_TRUE(some_ring) << family << ": the schedules must exercise rings";
  EXPECT_TRUE(some_scattered) << family << ": the shuffled free lists must scatter blocks";
}

TEST(V4PagedCache, ScatteredBlocksAndRingsAreBitIdentical) {
  // Windows of 8 positions, CSA rate 4 (overlapping), HCA rate 8: chunks of 5 and 4 cross them.
  v4_expect_scattered_blocks_change_nothing("deepseek_v4", 24, 5, 4);
}

TEST(V4PagedCache, ScatteredBlocksAndRingsAreBitIdenticalWithYarnAndLongWindows) {
  // HCA rate 128: sequence 0's chunks of 129 and 128 positions complete HCA windows 0 and 1 in
  // different steps, and its projections ring over 128 positions.
  v4_expect_scattered_blocks_change_nothing("deepseek_v4_yarn", 288, 129, 128);
}

TEST(V4PagedCache, PrefillAndDecodeMatchTheReferenceInAnyBlockLayout) {
  // The baseline of the tests above computes the reference: sequence 0 alone, prefill of the prompt
  // then decode, through one block per sequence and through small scattered blocks with rings.
  V4Model m = load_v4("deepseek_v4");
  const Reference ref = load_reference("deepseek_v4", 0);
  const std::vector<int32_t> ids(ref.input_ids.begin(), ref.input_ids.end() - 1);
  for (const V4CacheOptions options : {V4CacheOptions{32, 0}, V4CacheOptions{2, 5}}) {
    backend::Context ctx(2);
    auto cache = m.model->make_v4_cache(1, 32, options);
    engine::StepRunner runner(*m.model, ctx, *cache, 32);
    std::vector<float> logits;
    const auto prompt = static_cast<std::size_t>(ref.prompt_len);
    const Tensor first = runner.run({{0, std::vector<int32_t>(ids.begin(), ids.begin() + prompt), nullptr, {}}}, 0, true);
    logits.assign(first.data<float>(), first.data<float>() + first.numel());
    for (std::size_t t = prompt; t < ids.size(); ++t) {
      const Tensor next = runner.run({{0, {ids[t]}, nullptr, {}}});
      logits.insert(logits.end(), next.data<float>(), next.data<float>() + next.numel());
    }
    ASSERT_EQ(logits.size(), ref.logits.size());
    double max_err = 0, max_ref = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      max_err = std::max(max_err, std::abs(double(logits[i]) - ref.logits[i]));
      max_ref = std::max(max_ref, std::abs(ref.logits[i]));
    }
    EXPECT_LE(max_err / max_ref, 1e-4) << "blocks of " << options.block_size;
  }
}

// ---------------------------------------------------------------------------------------------
// What the cache holds.

TEST(V4PagedCache, LayersDeclareTheirStreams) {
  const V4Model m = load_v4("deepseek_v4_yarn");  // sliding, CSA (rate 4), HCA (rate 128), CSA
  const auto& s = m.spec;
  const int64_t d = s.head_dim, di = s.index_head_dim, f = sizeof(float);
  const auto sliding = models::v4_cache_specs(s, 0), csa = models::v4_cache_specs(s, 1),
             hca = models::v4_cache_specs(s, 2);
  EXPECT_EQ(sliding.window, CacheSpec::shared_sliding_kv(d, s.sliding_window));
  EXPECT_EQ(sliding.window.bytes_per_token(), d * f);  // K = V: one row
  EXPECT_FALSE(sliding.compressor_rows || sliding.entries || sliding.index_rows || sliding.index_keys);
  EXPECT_EQ(*csa.compressor_rows, CacheSpec::compressor_rows(2 * d, 4, true));
  EXPECT_EQ(csa.compressor_rows->bytes_per_token(), 2 * 2 * d * f);  // kv and gate, two series each
  EXPECT_EQ(*csa.entries, CacheSpec::compressed_entries(d, 4));
  EXPECT_EQ(csa.entries->bytes_per_token(), d * f / 4);
  EXPECT_EQ(*csa.index_rows, CacheSpec::compressor_rows(2 * di, 4, true));
  EXPECT_EQ(*csa.index_keys, CacheSpec::compressed_entries(di, 4));
  EXPECT_EQ(*hca.compressor_rows, CacheSpec::compressor_rows(d, 128, false));
  EXPECT_EQ(*hca.entries, CacheSpec::compressed_entries(d, 128));
  EXPECT_EQ(hca.entries->bytes_per_token(), d * f / 128);
  EXPECT_FALSE(hca.index_rows || hca.index_keys);
}

TEST(V4PagedCache, RingStreamsDoNotGrowWithCapacity) {
  const V4Model m = load_v4("deepseek_v4_yarn");
  const auto& s = m.spec;
  const int64_t seqs = 3, block = 4, f = sizeof(float);
  V4Cache a(s, seqs, 512, {block, 0}), b(s, seqs, 8192, {block, 0});
  for (int64_t l = 0; l < s.num_layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    // K = V rows: a ring covering the window - 1 positions before a token (the step's own rows
    // are read from the step), whatever the capacity.
    const int64_t window_blocks = ceil_div(s.sliding_window - 2, block) + 1;
    EXPECT_EQ(b.window(l).blocks_per_seq(), window_blocks);
    EXPECT_EQ(b.window(l).bytes(), seqs * window_blocks * block * s.head_dim * f);
    EXPECT_EQ(a.window(l).bytes(), b.window(l).bytes());
    for (auto get : {&V4Cache::compressor, &V4Cache::indexer}) {
      models::CompressorCache* ca = (a.*get)(l);
      models::CompressorCache* cb = (b.*get)(l);
      ASSERT_EQ(ca == nullptr, cb == nullptr);
      if (cb == nullptr) continue;
      const CacheSpec rows = cb->rows().spec(), entries = cb->entries().spec();
      // Projections: a ring covering the one or two windows an entry pools.
      const int64_t held = (rows.overlap ? 2 : 1) * rows.rate;
      const int64_t ring = ceil_div(held - 1, block) + 1;
      EXPECT_EQ(cb->rows().blocks_per_seq(), ring);
      EXPECT_EQ(cb->rows().bytes(), seqs * ring * block * rows.bytes_per_token());
      EXPECT_EQ(ca->rows().bytes(), cb->rows().bytes());
      // Entries: paged over the capacity, as the spec says (one per window), in whole blocks.
      EXPECT_EQ(cb->entries().bytes(), seqs * ceil_div(8192 / entries.rate, block) * block * entries.key_width * f);
      EXPECT_LE(cb->entries().bytes(), entries.bytes_per_token() * 8192 * seqs);
    }
  }
  // The whole cache is far below the unpaged layout's (every position's rows for every layer).
  int64_t unpaged = 0, paged = 0;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const auto specs = models::v4_cache_specs(s, l);
    unpaged += specs.window.bytes_per_token() * 8192 * seqs;
    if (specs.compressor_rows) unpaged += specs.compressor_rows->bytes_per_token() * 8192 * seqs;
    if (specs.index_rows) unpaged += specs.index_rows->bytes_per_token() * 8192 * seqs;
    paged += b.pool_bytes(l);
  }
  EXPECT_LT(paged * 20, unpaged);
}

// ---------------------------------------------------------------------------------------------
// Shortening a sequence.

// Logits of decoding ids[from, to) one token at a time on sequence 0.
std::vector<float> decode(engine::StepRunner& runner, const std::vector<int32_t>& ids, std::size_t from,
                          std::size_t to) {
  std::vector<float> out;
  for (std::size_t t = from; t < to; ++t) {
    const Tensor logits = runner.run({{0, {ids[t]}, nullptr, {}}});
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return out;
}

TEST(V4PagedCache, ShorteningResumesExactlyOrIsRefused) {
  V4Model m = load_v4("deepseek_v4");  // window 8, CSA rate 4 with overlap, HCA rate 8
  const auto ids = v4_reference_ids("deepseek_v4", 0);  // 20 tokens
  backend::Context ctx(2);
  auto run_and_rewind = [&](V4CacheOptions options, int64_t rewind_to) {
    auto cache = m.model->make_v4_cache(1, 24, options);
    engine::StepRunner runner(*m.model, ctx, *cache, 24);
    runner.run({{0, std::vector<int32_t>(ids.begin(), ids.begin() + 4), nullptr, {}}});
    const std::vector<float> first = decode(runner, ids, 4, 20);
    cache->set_length(0, rewind_to);
    EXPECT_EQ(cache->length(0), rewind_to);
    const std::vector<float> again = decode(runner, ids, static_cast<std::size_t>(rewind_to), 20);
    // The redone steps are the same steps over the same cache contents: bit-identical, including
    // entries of windows re-emitted from projections the cache kept.
    EXPECT_EQ(again, std::vector<float>(first.end() - static_cast<std::ptrdiff_t>(again.size()), first.end()))
        << "blocks of " << options.block_size << ", back to " << rewind_to;
  };
  run_and_rewind({32, 0}, 13);  // one block per sequence: any shortening resumes, as before
  run_and_rewind({32, 0}, 5);
  run_and_rewind({16, 3}, 17);  // rings of two blocks of 16 still hold positions 10.. and 12..
  run_and_rewind({2, 5}, 19);   // small rings: one position back

  // Back past what a ring still holds: refused, and the sequence keeps its length.
  auto cache = m.model->make_v4_cache(1, 24, {2, 5});
  engine::StepRunner runner(*m.model, ctx, *cache, 24);
  runner.run({{0, ids, nullptr, {}}});
  try {
    cache->set_length(0, 6);
    FAIL() << "shortening past the rings must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot shorten seq 0 from 20 to 6 positions"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache->length(0), 20);
  // Back to 0 always works: the sequence starts over and gives the first run's logits.
  auto fresh = m.model->make_v4_cache(1, 24, {2, 5});
  engine::StepRunner fresh_runner(*m.model, ctx, *fresh, 24);
  cache->set_length(0, 0);
  EXPECT_EQ(runner.run({{0, ids, nullptr, {}}}, 0, true).data<float>()[7],
            fresh_runner.run({{0, ids, nullptr, {}}}, 0, true).data<float>()[7]);
}

// ---------------------------------------------------------------------------------------------
// Kernels through paged views.

// A view over `rows` rows of `width` (key) and `width` (value) floats spread over blocks of
// `block` rows in the order `table` gives, plus the contiguous copy.
struct Scattered {
  std::vector<float> keys, values, flat_keys, flat_values;
  std::vector<int32_t> table;
  ops::PagedKv view;
};

Scattered scatter(int64_t rows, int64_t width, int64_t block, uint32_t seed) {
  Scattered s;
  const int64_t blocks = ceil_div(rows, block);
  s.table.resize(static_cast<std::size_t>(blocks));
  std::iota(s.table.begin(), s.table.end(), 0);
  std::shuffle(s.table.begin(), s.table.end(), std::mt19937(seed));
  s.keys.assign(static_cast<std::size_t>(blocks * block * width), NAN);  // unused rows poison
  s.values = s.keys;
  const Tensor k = random_normal({rows, width}, seed), v = random_normal({rows, width}, seed + 1);
  s.flat_keys.assign(k.data<float>(), k.data<float>() + k.numel());
  s.flat_values.assign(v.data<float>(), v.data<float>() + v.numel());
  s.view = {s.keys.data(), s.values.data(), width, width, block, s.table};
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(s.flat_keys.data() + r * width, width, s.view.key_row(r));
    std::copy_n(s.flat_values.data() + r * width, width, s.view.value_row(r));
  }
  return s;
}

TEST(V4PagedKernels, WindowPoolAndIndexerReadScatteredBlocksLikeContiguousRows) {
  backend::Context ctx(1);
  const ops::WindowPoolShape shape{4, 6, 12, true};
  const Scattered rows = scatter(20, shape.width, 3, 7);
  const Tensor bias = random_normal({shape.rate, shape.width}, 9);
  for (int64_t w = 0; w < 5; ++w) {
    std::vector<float> paged(6), flat(6);
    ops::gated_window_pool(ctx, rows.view, bias.data<float>(), shape, w, paged.data());
    ops::gated_window_pool(rows.flat_keys.data(), rows.flat_values.data(), bias.data<float>(), shape, w, flat.data());
    EXPECT_EQ(paged, flat) << "window " << w;
    for (float x : paged) EXPECT_TRUE(std::isfinite(x)) << "window " << w;  // no poisoned row read
  }
  const int64_t heads = 3, dim = 8, n = 11;
  const Scattered keys = scatter(n, dim, 2, 11);
  const Tensor q = random_normal({heads, dim}, 12), w = random_normal({heads}, 13);
  std::vector<float> paged(n), flat(n);
  ops::lightning_index_scores(q.data<float>(), w.data<float>(), keys.view, n, heads, dim, paged.data());
  ops::lightning_index_scores(q.data<float>(), w.data<float>(), keys.flat_keys.data(), n, heads, dim, flat.data());
  EXPECT_EQ(paged, flat);
  EXPECT_NE(paged, std::vector<float>(n, 0.0f));
}

// ---------------------------------------------------------------------------------------------
// Sinkhorn mixing.

// The loop DeepSeek-V4's hyper-connections ran before it became an op, verbatim in its float
// operation order: the op must reproduce it bit for bit.
std::vector<float> plain_sinkhorn(std::vector<float> m, std::size_t n, int64_t iters, float eps) {
  for (std::size_t j = 0; j < n; ++j) {
    float max_logit = -INFINITY;
    for (std::size_t k = 0; k < n; ++k) max_logit = std::max(max_logit, m[j * n + k]);
    float sum = 0;
    for (std::size_t k = 0; k < n; ++k) sum += (m[j * n + k] = std::exp(m[j * n + k] - max_logit));
    for (std::size_t k = 0; k < n; ++k) m[j * n + k] = m[j * n + k] / sum + eps;
  }
  auto columns = [&] {
    for (std::size_t k = 0; k < n; ++k) {
      float sum = 0;
      for (std::size_t j = 0; j < n; ++j) sum += m[j * n + k];
      for (std::size_t j = 0; j < n; ++j) m[j * n + k] /= sum + eps;
    }
  };
  auto rows = [&] {
    for (std::size_t j = 0; j < n; ++j) {
      float sum = 0;
      for (std::size_t k = 0; k < n; ++k) sum += m[j * n + k];
      for (std::size_t k = 0; k < n; ++k) m[j * n + k] /= sum + eps;
    }
  };
  columns();
  for (int64_t it = 1; it < iters; ++it) {
    rows();
    columns();
  }
  return m;
}

// The same in double precision.
std::vector<double> double_sinkhorn(const std::vector<float>& logits, std::size_t n, int64_t iters, double eps) {
  std::vector<double> m(logits.begin(), logits.end());
  for (std::size_t j = 0; j < n; ++j) {
    double max_logit = -INFINITY, sum = 0;
    for (std::size_t k = 0; k < n; ++k) max_logit = std::max(max_logit, m[j * n + k]);
    for (std::size_t k = 0; k < n; ++k) sum += std::exp(m[j * n + k] - max_logit);
    for (std::size_t k = 0; k < n; ++k) m[j * n + k] = std::exp(m[j * n + k] - max_logit) / sum + eps;
  }
  for (int64_t it = 0; it < 2 * iters - 1; ++it) {
    const bool by_column = it % 2 == 0;
    for (std::size_t a = 0; a < n; ++a) {
      double sum = 0;
      for (std::size_t b = 0; b < n; ++b) sum += by_column ? m[b * n + a] : m[a * n + b];
      for (std::size_t b = 0; b < n; ++b) (by_column ? m[b * n + a] : m[a * n + b]) /= sum + eps;
    }
  }
  return m;
}

TEST(Sinkhorn, MatchesThePlainLoopBitForBitAndDoublePrecisionClosely) {
  const float eps = 1e-6f;
  for (int64_t n : {1, 2, 3, 4, 7}) {
    for (int64_t iters : {1, 2, 20}) {
      SCOPED_TRACE("n " + std::to_string(n) + " iters " + std::to_string(iters));
      const Tensor logits = random_normal({n, n}, static_cast<uint32_t>(10 * n + iters));
      std::vector<float> m(logits.data<float>(), logits.data<float>() + n * n);
      for (float& x : m) x *= 3.0f;  // spread the softmax
      const std::vector<float> input = m;
      ops::sinkhorn_mix(m.data(), n, iters, eps);
      EXPECT_EQ(m, plain_sinkhorn(input, static_cast<std::size_t>(n), iters, eps));
      const std::vector<double> exact = double_sinkhorn(input, static_cast<std::size_t>(n), iters, eps);
      for (std::size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m[i], exact[i], 1e-5) << i;
      for (int64_t k = 0; k < n; ++k) {  // the last normalisation is over columns
        double column = 0;
        for (int64_t j = 0; j < n; ++j) column += m[j * n + k];
        EXPECT_NEAR(column, 1.0, 1e-3);  // sum / (sum + eps): further from 1 for a small column
      }
    }
  }
}

}  // namespace
}  // namespace r3::test
