// The EPLB map and load counts on the GPU (moe/device_expert_map.h): one thread per (token,
// choice) pair; counts by atomicAdd (integers: the order does not matter).
#include <vector>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "core/check.h"
#include "moe/device_expert_map.h"

namespace r3::moe {

namespace {

__global__ void map_pairs(const int32_t* logical, const int32_t* seqs, int64_t pairs, int32_t k, int32_t experts,
                          const int32_t* offsets, const int32_t* replicas, int32_t* physical, int32_t* counts) {
  backend::cuda::wait_for_predecessor();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int32_t e = logical[i];
  if (e < 0 || e >= experts) __trap();  // the routing kernel and the host's replay checks rule this out
  const int32_t first = offsets[e], count = offsets[e + 1] - first;
  // i = token * k + choice: the CPU's ExpertPlacement::choose.
  const int32_t p = replicas[first + static_cast<int32_t>(i % count)];
  physical[i] = p;
  if (counts != nullptr && seqs[i / k] >= 0) atomicAdd(&counts[p], 1);
}

// Offsets [logical + 1] then replicas [physical], as the kernel reads them.
std::vector<int32_t> tables_of(const ExpertPlacement& placement) {
  std::vector<int32_t> t;
  int32_t offset = 0;
  for (int32_t e = 0; e < placement.num_logical(); ++e) {
    t.push_back(offset);
    offset += static_cast<int32_t>(placement.replicas(e).size());
  }
  t.push_back(offset);
  for (int32_t e = 0; e < placement.num_logical(); ++e) {
    for (const int32_t p : placement.replicas(e)) t.push_back(p);
  }
  return t;
}

}  // namespace

DeviceExpertMap::DeviceExpertMap(backend::Context& ctx, const ExpertPlacement& placement)
    : ctx_(ctx), logical_(placement.num_logical()), physical_(placement.num_physical()) {
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  R3_CUDA_CHECK(cudaMalloc(&tables_, static_cast<std::size_t>(logical_ + 1 + physical_) * sizeof(int32_t)));
  update(placement);
}

DeviceExpertMap::~DeviceExpertMap() {
  if (tables_) cudaFree(tables_);
}

void DeviceExpertMap::update(const ExpertPlacement& placement) {
  R3_CHECK(placement.num_logical() == logical_ && placement.num_physical() == physical_, "EPLB map (cuda): a placement of ",
           placement.num_logical(), " experts on ", placement.num_physical(), " physical ones replaces one of ", logical_,
           " on ", physical_);
  const std::vector<int32_t> tables = tables_of(placement);
  // Ordered on the context's stream: the steps before read the old tables, the ones after the new.
  R3_CUDA_CHECK(cudaMemcpyAsync(tables_, tables.data(), tables.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                ctx_.cuda_state().stream));
  R3_CUDA_CHECK(cudaStreamSynchronize(ctx_.cuda_state().stream));  // `tables` is pageable and local
}

DevicePhysicalRouting DeviceExpertMap::map(backend::Context& ctx, const DeviceCapturedRouting& captured,
                                           const int32_t* seqs, int32_t* physical, int32_t* counts) const {
  const int64_t k = captured.k(), pairs = captured.tokens() * k;
  const DevicePhysicalRouting mapped(physical, captured.weights(), captured.tokens(), k);
  if (pairs == 0) return mapped;
  constexpr int kThreads = 256;
  backend::cuda::launch_kernel(map_pairs, static_cast<unsigned>((pairs + kThreads - 1) / kThreads), kThreads, 0,
                               ctx.cuda_state().stream, captured.ids(), seqs, pairs, static_cast<int32_t>(k),
                               static_cast<int32_t>(logical_), tables_, tables_ + logical_ + 1, physical, counts);
  R3_CUDA_CHECK(cudaGetLastError());
  return mapped;
}

DevicePhysicalRouting map_on_host(backend::Context& ctx, const PhysicalExperts& experts,
                                  const DeviceCapturedRouting& captured, int32_t* physical) {
  const int64_t tokens = captured.tokens(), k = captured.k();
  std::vector<int32_t> ids(static_cast<std::size_t>(tokens * k));
  R3_CUDA_CHECK(cudaStreamSynchronize(ctx.cuda_state().stream));
  R3_CUDA_CHECK(cudaMemcpy(ids.data(), captured.ids(), ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < k; ++c) {
      int32_t& id = ids[static_cast<std::size_t>(t * k + c)];
      id = experts.map_choice(id, t, c, k);
      R3_CHECK(id >= 0 && id < experts.num_physical(), "EPLB map: physical expert ", id, " outside [0, ",
               experts.num_physical(), ")");
    }
  }
  R3_CUDA_CHECK(cudaMemcpy(physical, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return {physical, captured.weights(), tokens, k};
}

struct DeviceLoadCounts::Impl {
  int32_t* counts = nullptr;  // device [layers, width]
  int32_t* host = nullptr;    // pinned, the same
  cudaEvent_t copied = nullptr;

  ~Impl() {
    if (copied) cudaEventDestroy(copied);
    if (host) cudaFreeHost(host);
    if (counts) cudaFree(counts);
  }
};

DeviceLoadCounts::DeviceLoadCounts(backend::Context& ctx, int64_t moe_layers, int64_t width)
    : ctx_(ctx), layers_(moe_layers), width_(width), impl_(std::make_unique<Impl>()) {
  R3_CHECK(moe_layers > 0 && width > 0, "device load counts: ", moe_layers, " layers x ", width, " experts");
  const auto bytes = static_cast<std::size_t>(moe_layers * width) * sizeof(int32_t);
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  R3_CUDA_CHECK(cudaMalloc(&impl_->counts, bytes));
  R3_CUDA_CHECK(cudaMallocHost(&impl_->host, bytes));
  R3_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->copied, cudaEventDisableTiming));
}

DeviceLoadCounts::~DeviceLoadCounts() = default;

int32_t* DeviceLoadCounts::layer(int64_t moe_layer) const {
  R3_CHECK(moe_layer >= 0 && moe_layer < layers_, "device load counts: MoE layer ", moe_layer, " of ", layers_);
  return impl_->counts + moe_layer * width_;
}

void DeviceLoadCounts::begin_step() {
  R3_CUDA_CHECK(cudaMemsetAsync(impl_->counts, 0, static_cast<std::size_t>(layers_ * width_) * sizeof(int32_t),
                                ctx_.cuda_state().stream));
}

void DeviceLoadCounts::end_step() {
  R3_CUDA_CHECK(cudaMemcpyAsync(impl_->host, impl_->counts, static_cast<std::size_t>(layers_ * width_) * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, ctx_.cuda_state().stream));
  R3_CUDA_CHECK(cudaEventRecord(impl_->copied, ctx_.cuda_state().stream));
}

std::span<const int32_t> DeviceLoadCounts::collect() {
  R3_CUDA_CHECK(cudaEventSynchronize(impl_->copied));
  return {impl_->host, static_cast<std::size_t>(layers_ * width_)};
}

}  // namespace r3::moe
