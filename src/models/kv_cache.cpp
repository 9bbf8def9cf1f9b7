#include "models/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <utility>

#include <unistd.h>

#include "backend/device_memory.h"
#include "core/check.h"
#include "core/checked.h"

namespace r3::models {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void check_cache_memory(int64_t bytes, int64_t capacity, const char* what) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: the allocation itself is the check
  const int64_t memory = static_cast<int64_t>(pages) * page;
  R3_CHECK(bytes <= memory, what, " for ", capacity, " tokens needs ", bytes, " bytes, more than the machine's memory of ",
           memory, " bytes");
}

uint64_t KvCache::next_serial() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

KvCache::KvCache(std::vector<CacheSpec> layers, int64_t max_seqs, int64_t capacity, KvCacheOptions options)
    : max_seqs_(max_seqs), capacity_(capacity), block_size_(options.block_size),
      engine_pool_blocks_(options.pool_blocks), on_device_(options.device != nullptr), device_(options.device) {
  R3_CHECK(!layers.empty() && max_seqs > 0 && capacity > 0 && block_size_ > 0 && engine_pool_blocks_ >= 0,
           "KV cache: layers, seqs, capacity and block size must be positive");
  R3_CHECK(options.device_dtype == DType::F32 || (on_device_ && options.device_dtype == DType::BF16),
           "KV cache: pools of ", dtype_name(options.device_dtype), " (float32, or bfloat16 on a device)");
  table_blocks_ = ceil_div(capacity_, block_size_);
  int64_t total_bytes = 0;  // every layer's pool, checked before any is allocated
  for (std::size_t pass = 0; pass < 2; ++pass) {
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const CacheSpec& spec = layers[l];
    R3_CHECK(spec.key_width > 0 && spec.value_width > 0, "KV cache: layer ", l, " caches rows of width ",
             spec.key_width, "/", spec.value_width);
    Layer layer;
    layer.spec = spec;
    layer.seq_blocks = table_blocks_;
    layer.positions_per_pass = capacity_;
    if (spec.kind == CacheSpec::Kind::kRecurrentState) {  // one state per sequence, no blocks
      const int64_t floats = checked_add(checked_mul(max_seqs_, spec.key_width, "KV cache: recurrent state"),
                                         checked_mul(max_seqs_, spec.value_width, "KV cache: recurrent state"),
                                         "KV cache: recurrent state");
      if (pass == 0) {
        total_bytes = checked_add(total_bytes, floats * static_cast<int64_t>(sizeof(float)), "KV cache: bytes");
        continue;
      }
      // Float32 wherever it lives (a bf16 device cache too): every token rewrites the whole
      // state, so rounding it to bf16 would compound over a sequence.
      const Shape first{max_seqs_, spec.key_width}, second{max_seqs_, spec.value_width};
      layer.keys = on_device_ ? backend::device_empty(*options.device, DType::F32, first) : Tensor::empty(DType::F32, first);
      layer.values =
          on_device_ ? backend::device_empty(*options.device, DType::F32, second) : Tensor::empty(DType::F32, second);
      layers_.push_back(std::move(layer));
      continue;
    }
    R3_CHECK(!on_device_ || spec.kind == CacheSpec::Kind::kFullKv || spec.kind == CacheSpec::Kind::kSlidingWindowKv ||
                 spec.kind == CacheSpec::Kind::kLatent,
             "KV cache: layer ", l, "'s cache kind has no device storage yet");
    if (spec.kind == CacheSpec::Kind::kSlidingWindowKv && engine_pool_blocks_ == 0 && !on_device_) {
      R3_CHECK(spec.window > 0, "KV cache: layer ", l, " has a sliding window of ", spec.window);
      // A pass writes at most block_size new positions of a sequence before reading; the token at p
      // then needs [p - W + 1, p] while positions up to p + block_size - 1 may be written: a
      // span of W + block_size - 1 positions, which touches at most
      // ceil((W + block_size - 2) / block_size) + 1 consecutive blocks.
      const int64_t ring = ceil_div(spec.window + block_size_ - 2, block_size_) + 1;
      if (ring < table_blocks_) {
        layer.seq_blocks = ring;
        layer.positions_per_pass = block_size_;
      }
    }
    const int64_t pool_blocks =
        engine_pool_blocks_ > 0 ? engine_pool_blocks_ : checked_mul(max_seqs_, layer.seq_blocks, "KV cache: seqs x blocks");
    R3_CHECK(pool_blocks <= INT32_MAX, "KV cache: ", pool_blocks, " blocks exceed int32 block ids");
    if (pass == 0) {
      const int64_t rows = checked_mul(pool_blocks, block_size_, "KV cache: blocks x block size");
      const int64_t width = checked_add(spec.key_width, spec.value_width, "KV cache: key + value width");
      const int64_t bytes = checked_mul(checked_mul(rows, width, "KV cache: rows x width"),
                                        static_cast<int64_t>(sizeof(float)), "KV cache: bytes");
      total_bytes = checked_add(total_bytes, bytes, "KV cache: bytes");
      continue;
    }
    const Shape key_shape{pool_blocks * block_size_ * spec.key_width};
    const Shape value_shape{pool_blocks * block_size_ * spec.value_width};
    layer.keys = on_device_ ? backend::device_empty(*options.device, options.device_dtype, key_shape)
                            : Tensor::empty(DType::F32, key_shape);
    layer.values = on_device_ ? backend::device_empty(*options.device, options.device_dtype, value_shape)
                              : Tensor::empty(DType::F32, value_shape);
    layer.pool_blocks = pool_blocks;
    // Today's allocator: every sequence takes its blocks from the free list up front.
    std::vector<int32_t> free_list(static_cast<std::size_t>(pool_blocks));
    std::iota(free_list.begin(), free_list.end(), 0);
    if (options.shuffle_seed != 0) {
      // Device pools: one shuffle for all layers (the step carries one set of tables).
      std::mt19937_64 rng(options.shuffle_seed + (on_device_ ? 0 : l));
      for (std::size_t i = free_list.size(); i > 1; --i) {  // Fisher-Yates, the same on every platform
        std::swap(free_list[i - 1], free_list[static_cast<std::size_t>(rng() % i)]);
      }
    }
    layer.tables.assign(static_cast<std::size_t>(max_seqs_ * table_blocks_), -1);
    for (int64_t s = 0; s < max_seqs_ && engine_pool_blocks_ == 0; ++s) {
      for (int64_t i = 0; i < table_blocks_; ++i) {
        // A ring reuses its blocks: logical block i is the sequence's block i mod ring.
        layer.tables[static_cast<std::size_t>(s * table_blocks_ + i)] =
            free_list[static_cast<std::size_t>(s * layer.seq_blocks + i % layer.seq_blocks)];
      }
    }
    layers_.push_back(std::move(layer));
  }
  if (pass == 0 && !on_device_) check_cache_memory(total_bytes, capacity_, "the KV cache");
  }
  lengths_.assign(static_cast<std::size_t>(max_seqs_), 0);
  high_water_.assign(static_cast<std::size_t>(max_seqs_), 0);
}

const KvCache::Layer& KvCache::paged_layer() const {
  for (const Layer& layer : layers_) {
    if (!is_recurrent(layer)) return layer;
  }
  R3_FAIL("KV cache: no layer keeps positions");
}

std::string KvCache::prefix_sharing_unsupported() const {
  for (const Layer& layer : layers_) {
    if (is_recurrent(layer)) {
      return "its linear-attention layers keep one recurrent state per sequence, not per position, so a cached "
             "prefix's blocks do not hold the state after it";
    }
  }
  return engine_pool_blocks_ > 0 ? "" : "its blocks are fixed per sequence (made without pool_blocks)";
}

const KvCache::Layer& KvCache::at(int64_t layer) const {
  R3_CHECK(layer >= 0 && layer < num_layers(), "KV cache: layer ", layer, " out of range");
  return layers_[static_cast<std::size_t>(layer)];
}

int64_t KvCache::bytes_per_token() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    // The spec counts float32 rows; a bf16 device pool stores half of that.
    const bool bf16 = layer.keys.defined() && layer.keys.dtype() == DType::BF16;
    bytes += bf16 ? layer.spec.bytes_per_token() / 2 : layer.spec.bytes_per_token();
  }
  return bytes;
}

int64_t KvCache::pool_bytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    bytes += static_cast<int64_t>(layer.keys.nbytes() + layer.values.nbytes());
  }
  return bytes;
}

std::span<const int32_t> KvCache::block_table(int64_t layer, int64_t seq) const {
  const Layer& l = is_recurrent(at(layer)) ? paged_layer() : at(layer);  // every paged layer has the same table
  R3_CHECK(seq >= 0 && seq < max_seqs_, "KV cache: seq ", seq, " out of range");
  return std::span<const int32_t>(l.tables).subspan(static_cast<std::size_t>(seq * table_blocks_),
                                                    static_cast<std::size_t>(table_blocks_));
}

ops::PagedKv KvCache::view(int64_t layer, int64_t seq) {
  R3_CHECK(!is_recurrent(at(layer)), "KV cache: layer ", layer, " keeps a recurrent state, not rows");
  const std::span<const int32_t> table = block_table(layer, seq);
  R3_CHECK(!on_device_, "KV cache: the pools are in device memory (use pool)");
  Layer& l = layers_[static_cast<std::size_t>(layer)];
  return {l.keys.data<float>(), l.values.data<float>(), l.spec.key_width, l.spec.value_width, block_size_, table};
}

KvCache::SequenceState KvCache::state(int64_t layer, int64_t seq) {
  R3_CHECK(is_recurrent(at(layer)), "KV cache: layer ", layer, " keeps rows, not a recurrent state");
  R3_CHECK(seq >= 0 && seq < max_seqs_, "KV cache: seq ", seq, " out of range");
  Layer& l = layers_[static_cast<std::size_t>(layer)];
  return {l.keys.data<float>() + seq * l.spec.key_width, l.values.data<float>() + seq * l.spec.value_width};
}

ops::KvPool KvCache::pool(int64_t layer) {
  at(layer);  // range check
  Layer& l = layers_[static_cast<std::size_t>(layer)];
  return {l.keys.raw_data(), l.values.raw_data(), l.spec.key_width, l.spec.value_width, block_size_,
          l.pool_blocks, l.keys.dtype() == DType::BF16};
}

ops::StepView KvCache::step_for_layer(const ops::StepView& step, int64_t layer) const {
  const Layer& l = at(layer);
  if (on_device_ || is_recurrent(l)) return step;
  ops::StepView view = step;
  view.block_tables = l.tables.data();
  view.table_stride = table_blocks_;
  return view;
}

void for_each_pass(const KvCache& cache, int64_t layer, const ops::StepView& step, backend::Workspace& workspace,
                   FunctionRef<void(int64_t first, const ops::StepView& pass)> fn) {
  if (!cache.rings(layer)) return fn(0, step);
  const int64_t most = std::max<int64_t>(1, cache.positions_per_pass(layer));
  backend::Workspace::Scope scope(workspace);
  const std::span<int64_t> in_pass = workspace.array<int64_t>(cache.max_seqs());
  for (int64_t first = 0, end = 0; first < step.tokens; first = end) {
    std::fill(in_pass.begin(), in_pass.end(), 0);
    for (end = first; end < step.tokens; ++end) {
      const int32_t seq = step.seqs[end];
      if (seq < 0) continue;
      R3_CHECK(seq < cache.max_seqs(), "attention: seq ", seq, " out of range");
      if (in_pass[static_cast<std::size_t>(seq)] == most) break;
      ++in_pass[static_cast<std::size_t>(seq)];
    }
    ops::StepView pass = step;
    pass.tokens = end - first;
    if (pass.token_ids != nullptr) pass.token_ids += first;
    pass.positions += first;
    pass.seqs += first;
    pass.logit_rows = nullptr;
    pass.logit_row_count = 0;
    pass.forced = nullptr;
    pass.replayed = nullptr;
    fn(first, pass);
  }
}

void KvCache::set_block_table(int64_t seq, std::span<const int32_t> blocks) {
  R3_CHECK(engine_pool_blocks_ > 0, "KV cache: block tables are fixed (made without pool_blocks)");
  R3_CHECK(seq >= 0 && seq < max_seqs_, "KV cache: seq ", seq, " out of range");
  R3_CHECK(static_cast<int64_t>(blocks.size()) <= table_blocks_, "KV cache: ", blocks.size(),
           " blocks for seq ", seq, ", more than the ", table_blocks_, " its capacity needs");
  for (const int32_t b : blocks) {
    R3_CHECK(b >= 0 && b < engine_pool_blocks_, "KV cache: block ", b, " outside the pool of ", engine_pool_blocks_);
  }
  for (Layer& layer : layers_) {
    if (is_recurrent(layer)) continue;
    const auto row = layer.tables.begin() + seq * table_blocks_;
    std::fill(std::copy(blocks.begin(), blocks.end(), row), row + table_blocks_, -1);
  }
}

bool KvCache::covers(int64_t seq, int64_t pos) const {
  if (pos < 0 || pos >= capacity_) return false;
  return paged_layer().tables[static_cast<std::size_t>(seq * table_blocks_ + pos / block_size_)] >= 0;
}

void KvCache::set_length(int64_t seq, int64_t length) {
  R3_CHECK(seq >= 0 && seq < max_seqs_, "KV cache: seq ", seq, " out of range");
  R3_CHECK(length >= 0 && length <= capacity_, "KV cache: length ", length,
           " exceeds capacity ", capacity_, " tokens");
  const auto s = static_cast<std::size_t>(seq);
  if (length == 0) {
    high_water_[s] = 0;
    for (Layer& layer : layers_) {
      if (!is_recurrent(layer)) continue;
      Tensor first = layer.keys.rows(seq, seq + 1), second = layer.values.rows(seq, seq + 1);
      if (device_ != nullptr) {  // queued on the device's stream, before the sequence's next step
        backend::fill_zero(*device_, first);
        backend::fill_zero(*device_, second);
      } else {
        std::fill(first.data<float>(), first.data<float>() + first.numel(), 0.0f);
        std::fill(second.data<float>(), second.data<float>() + second.numel(), 0.0f);
      }
    }
  } else if (length < high_water_[s]) {
    for (const Layer& layer : layers_) {
      R3_CHECK(!is_recurrent(layer), "KV cache: cannot shorten seq ", seq, " from ", high_water_[s], " to ", length,
               " positions: its recurrent state has taken in every position since");
      if (!is_ring(layer)) continue;
      // The next token (at `length`) reads back to length - W + 1; positions up to
      // high_water - 1 were written since, and must not have wrapped onto those blocks.
      const int64_t oldest = std::max<int64_t>(0, length - layer.spec.window + 1);
      R3_CHECK((high_water_[s] - 1) / block_size_ - oldest / block_size_ < layer.seq_blocks,
               "KV cache: cannot shorten seq ", seq, " from ", high_water_[s], " to ", length,
               " positions: its sliding-window blocks have been reused since");
    }
  }
  high_water_[s] = std::max(high_water_[s], length);
  lengths_[s] = length;
}

}  // namespace r3::models
