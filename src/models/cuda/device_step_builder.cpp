#include "models/device_step_builder.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/state.h"

namespace r3::models {

namespace {
constexpr int kBuffers = 2;
}

struct DeviceStepBuilder::Impl {
  std::size_t ints = 0;                // int32 values per buffer
  int32_t* staging[kBuffers] = {};     // pinned host
  int32_t* device[kBuffers] = {};      // device
  cudaEvent_t copied[kBuffers] = {};   // the buffer's last upload has been read
  bool used[kBuffers] = {};
  int next = 0;

  ~Impl() {
    for (int b = 0; b < kBuffers; ++b) {
      if (copied[b]) cudaEventDestroy(copied[b]);
      if (staging[b]) cudaFreeHost(staging[b]);
      if (device[b]) cudaFree(device[b]);
    }
  }
};

DeviceStepBuilder::DeviceStepBuilder(backend::Context& ctx, int64_t max_tokens, int64_t slots,
                                     int64_t max_blocks_per_slot)
    : ctx_(ctx), max_tokens_(max_tokens), slots_(slots), stride_(max_blocks_per_slot), impl_(std::make_unique<Impl>()) {
  R3_CHECK(max_tokens > 0 && slots > 0 && max_blocks_per_slot > 0, "device step: ", max_tokens, " tokens, ", slots,
           " slots of ", max_blocks_per_slot, " blocks");
  impl_->ints = static_cast<std::size_t>(3 * max_tokens + slots * max_blocks_per_slot);
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  for (int b = 0; b < kBuffers; ++b) {
    R3_CUDA_CHECK(cudaMallocHost(&impl_->staging[b], impl_->ints * sizeof(int32_t)));
    R3_CUDA_CHECK(cudaMalloc(&impl_->device[b], impl_->ints * sizeof(int32_t)));
    R3_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->copied[b], cudaEventDisableTiming));
  }
}

DeviceStepBuilder::~DeviceStepBuilder() = default;

ops::DeviceStep DeviceStepBuilder::build(std::span<const int32_t> token_ids, std::span<const int32_t> positions,
                                         std::span<const int32_t> seqs,
                                         std::span<const std::span<const int32_t>> tables) {
  const auto tokens = static_cast<int64_t>(token_ids.size());
  R3_CHECK(tokens <= max_tokens_ && positions.size() == token_ids.size() && seqs.size() == token_ids.size(),
           "device step: ", tokens, " tokens (room for ", max_tokens_, "), ", positions.size(), " positions, ",
           seqs.size(), " sequence slots");
  R3_CHECK(static_cast<int64_t>(tables.size()) <= slots_, "device step: ", tables.size(), " block tables (room for ",
           slots_, ")");
  const int b = impl_->next;
  impl_->next = (b + 1) % kBuffers;
  // The buffer's previous upload (two builds ago) must have been read before it is rewritten.
  if (impl_->used[b]) R3_CUDA_CHECK(cudaEventSynchronize(impl_->copied[b]));
  int32_t* host = impl_->staging[b];
  std::copy(token_ids.begin(), token_ids.end(), host);
  std::copy(positions.begin(), positions.end(), host + max_tokens_);
  std::copy(seqs.begin(), seqs.end(), host + 2 * max_tokens_);
  int32_t* table_area = host + 3 * max_tokens_;
  std::fill(table_area, table_area + slots_ * stride_, -1);
  for (std::size_t s = 0; s < tables.size(); ++s) {
    R3_CHECK(static_cast<int64_t>(tables[s].size()) <= stride_, "device step: slot ", s, " has ", tables[s].size(),
             " blocks (room for ", stride_, ")");
    std::copy(tables[s].begin(), tables[s].end(), table_area + static_cast<int64_t>(s) * stride_);
  }
  const cudaStream_t stream = ctx_.cuda_state().stream;
  R3_CUDA_CHECK(cudaMemcpyAsync(impl_->device[b], host, impl_->ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  R3_CUDA_CHECK(cudaEventRecord(impl_->copied[b], stream));
  impl_->used[b] = true;
  const int32_t* d = impl_->device[b];
  int64_t max_context = 0;
  for (std::size_t t = 0; t < positions.size(); ++t) {
    if (seqs[t] >= 0) max_context = std::max<int64_t>(max_context, positions[t] + 1);
  }
  return {tokens, d, d + max_tokens_, d + 2 * max_tokens_, d + 3 * max_tokens_, stride_, max_context};
}

}  // namespace r3::models
