#include "models/device_step_builder.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/state.h"

namespace r3::models {

namespace {
constexpr int kBuffers = 2;
}

// Two pinned staging buffers alternate on the host; on the device there is one buffer, which every
// step's copy overwrites after the previous step's kernels (all on the context's stream). So a
// step's metadata always has the same device addresses, which a CUDA graph of the step can bake in.
struct DeviceStepBuilder::Impl {
  std::size_t ints = 0;                // int32 values per buffer
  int32_t* staging[kBuffers] = {};     // pinned host
  int32_t* device = nullptr;
  cudaEvent_t copied[kBuffers] = {};   // the staging buffer's last upload has been read
  bool used[kBuffers] = {};
  int next = 0;

  ~Impl() {
    for (int b = 0; b < kBuffers; ++b) {
      if (copied[b]) cudaEventDestroy(copied[b]);
      if (staging[b]) cudaFreeHost(staging[b]);
    }
    if (device) cudaFree(device);
  }
};

// Layout of a buffer, in int32 values: token ids, positions, sequence slots and logit rows
// (max_tokens each), the block tables (slots x stride), the forced ids (max_tokens x replay
// width), then the replay mask as bytes (max_tokens, rounded up to whole ints).
DeviceStepBuilder::DeviceStepBuilder(backend::Context& ctx, int64_t max_tokens, int64_t slots,
                                     int64_t max_blocks_per_slot, int64_t replay_layers, int64_t replay_k)
    : ctx_(ctx),
      max_tokens_(max_tokens),
      slots_(slots),
      stride_(max_blocks_per_slot),
      replay_width_(replay_layers * replay_k),
      replay_k_(replay_k),
      impl_(std::make_unique<Impl>()) {
  R3_CHECK(max_tokens > 0 && slots > 0 && max_blocks_per_slot > 0 && replay_layers >= 0 && replay_k >= 0,
           "device step: ", max_tokens, " tokens, ", slots, " slots of ", max_blocks_per_slot, " blocks, replays of ",
           replay_layers, " layers x ", replay_k);
  impl_->ints = static_cast<std::size_t>(4 * max_tokens + slots * max_blocks_per_slot + max_tokens * replay_width_ +
                                         (max_tokens + 3) / 4);
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  R3_CUDA_CHECK(cudaMalloc(&impl_->device, impl_->ints * sizeof(int32_t)));
  for (int b = 0; b < kBuffers; ++b) {
    R3_CUDA_CHECK(cudaMallocHost(&impl_->staging[b], impl_->ints * sizeof(int32_t)));
    R3_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->copied[b], cudaEventDisableTiming));
  }
}

DeviceStepBuilder::~DeviceStepBuilder() = default;

ops::StepView DeviceStepBuilder::build(std::span<const int32_t> token_ids, std::span<const int32_t> positions,
                                         std::span<const int32_t> seqs,
                                         std::span<const std::span<const int32_t>> tables,
                                         std::span<const int64_t> logit_rows, Replay replay) {
  const auto tokens = static_cast<int64_t>(token_ids.size());
  R3_CHECK(tokens <= max_tokens_ && positions.size() == token_ids.size() && seqs.size() == token_ids.size(),
           "device step: ", tokens, " tokens (room for ", max_tokens_, "), ", positions.size(), " positions, ",
           seqs.size(), " sequence slots");
  R3_CHECK(static_cast<int64_t>(tables.size()) <= slots_, "device step: ", tables.size(), " block tables (room for ",
           slots_, ")");
  const bool replays = !replay.forced.empty();
  R3_CHECK(!replays || (replay_width_ > 0 && static_cast<int64_t>(replay.forced.size()) == tokens * replay_width_ &&
                        (replay.replayed.empty() || static_cast<int64_t>(replay.replayed.size()) == tokens)),
           "device step: a replayed routing of ", replay.forced.size(), " ids and ", replay.replayed.size(),
           " mask values for ", tokens, " tokens (", replay_width_, " ids per token)");
  R3_CHECK(static_cast<int64_t>(logit_rows.size()) <= tokens, "device step: ", logit_rows.size(), " logit rows for ",
           tokens, " tokens");
  const int b = impl_->next;
  impl_->next = (b + 1) % kBuffers;
  // The buffer's previous upload (two builds ago) must have been read before it is rewritten.
  if (impl_->used[b]) R3_CUDA_CHECK(cudaEventSynchronize(impl_->copied[b]));
  int32_t* host = impl_->staging[b];
  std::copy(token_ids.begin(), token_ids.end(), host);
  std::copy(positions.begin(), positions.end(), host + max_tokens_);
  std::copy(seqs.begin(), seqs.end(), host + 2 * max_tokens_);
  int32_t* rows_area = host + 3 * max_tokens_;
  const auto row_count = static_cast<int64_t>(logit_rows.empty() ? token_ids.size() : logit_rows.size());
  for (int64_t i = 0; i < row_count; ++i) {
    const int64_t row = logit_rows.empty() ? i : logit_rows[static_cast<std::size_t>(i)];
    R3_CHECK(row >= 0 && row < tokens, "device step: logit row ", row, " of ", tokens, " tokens");
    rows_area[i] = static_cast<int32_t>(row);
  }
  int32_t* table_area = host + 4 * max_tokens_;
  std::fill(table_area, table_area + slots_ * stride_, -1);
  for (std::size_t s = 0; s < tables.size(); ++s) {
    R3_CHECK(static_cast<int64_t>(tables[s].size()) <= stride_, "device step: slot ", s, " has ", tables[s].size(),
             " blocks (room for ", stride_, ")");
    std::copy(tables[s].begin(), tables[s].end(), table_area + static_cast<int64_t>(s) * stride_);
  }
  // Forced ids go layer-major, so that each layer's rows are one [tokens, k] array.
  int32_t* forced_area = table_area + slots_ * stride_;
  auto* mask_area = reinterpret_cast<uint8_t*>(forced_area + max_tokens_ * replay_width_);
  if (replays) {
    const int64_t k = replay_k_, layers = replay_width_ / replay_k_;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < layers; ++j) {
        std::copy_n(replay.forced.data() + (t * layers + j) * k, k, forced_area + (j * tokens + t) * k);
      }
      mask_area[t] = replay.replayed.empty() ? 1 : replay.replayed[static_cast<std::size_t>(t)];
    }
  }
  const cudaStream_t stream = ctx_.cuda_state().stream;
  R3_CUDA_CHECK(cudaMemcpyAsync(impl_->device, host, impl_->ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  R3_CUDA_CHECK(cudaEventRecord(impl_->copied[b], stream));
  impl_->used[b] = true;
  const int32_t* d = impl_->device;
  int64_t max_context = 0;
  for (std::size_t t = 0; t < positions.size(); ++t) {
    if (seqs[t] >= 0) max_context = std::max<int64_t>(max_context, positions[t] + 1);
  }
  // A step of padding rows only (an expert-parallel rank with no tokens of its own still runs each
  // layer to take part in the exchanges) sizes the attention grids by one position: its rows
  // attend to nothing either way, and the kernels refuse a step whose size was never set.
  if (tokens > 0 && max_context == 0) max_context = 1;
  ops::StepView step{tokens, d, d + max_tokens_, d + 2 * max_tokens_, d + 4 * max_tokens_, stride_, max_context};
  step.logit_rows = d + 3 * max_tokens_;
  step.logit_row_count = row_count;
  if (replays) {
    step.forced = d + 4 * max_tokens_ + slots_ * stride_;
    step.replayed = reinterpret_cast<const uint8_t*>(step.forced + max_tokens_ * replay_width_);
  }
  return step;
}

}  // namespace r3::models
