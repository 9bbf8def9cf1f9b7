// Device allocations and host<->device copies on a CUDA context's stream.
#include <cstring>
#include <memory>

#include "backend/context.h"
#include "backend/cuda/state.h"
#include "core/checked.h"
#include "core/tensor.h"

namespace r3::backend::cuda {

Tensor empty(Context& ctx, DType dtype, Shape shape) {
  State& s = ctx.cuda_state();
  const int64_t count = shape_numel(shape);
  const std::size_t bytes = checked_mul(static_cast<std::size_t>(count), dtype_size(dtype), "device tensor bytes");
  void* data = nullptr;
  R3_CUDA_CHECK(cudaSetDevice(s.device));
  R3_CUDA_CHECK(cudaMalloc(&data, bytes == 0 ? 1 : bytes));
  std::shared_ptr<const void> owner(data, [](const void* p) { cudaFree(const_cast<void*>(p)); });
  R3_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, s.stream));
  return Tensor::view(dtype, std::move(shape), data, std::move(owner), Storage::kOwned, Device::kCuda);
}

Tensor pinned_host(Context& ctx, DType dtype, Shape shape) {
  const std::size_t bytes =
      checked_mul(static_cast<std::size_t>(shape_numel(shape)), dtype_size(dtype), "pinned host tensor bytes");
  void* data = nullptr;
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  R3_CUDA_CHECK(cudaHostAlloc(&data, bytes == 0 ? 1 : bytes, cudaHostAllocDefault));
  std::shared_ptr<const void> owner(data, [](const void* p) { cudaFreeHost(const_cast<void*>(p)); });
  std::memset(data, 0, bytes);
  return Tensor::view(dtype, std::move(shape), data, std::move(owner), Storage::kOwned, Device::kCpu);
}

Tensor upload(Context& ctx, const Tensor& host) {
  Tensor t = empty(ctx, host.dtype(), host.shape());
  State& s = ctx.cuda_state();
  R3_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice, s.stream));
  // The host tensor may be freed when this returns: the copy must have read it.
  R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return t;
}

Tensor download(Context& ctx, const Tensor& t) {
  R3_CHECK(t.is_contiguous(), "to_host: needs a contiguous tensor");
  State& s = ctx.cuda_state();
  Tensor host = Tensor::empty(t.dtype(), t.shape());
  R3_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), t.raw_data(), t.nbytes(), cudaMemcpyDeviceToHost, s.stream));
  R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return host;
}

void download_into(Context& ctx, const Tensor& t, Tensor& host) {
  State& s = ctx.cuda_state();
  R3_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), t.raw_data(), t.nbytes(), cudaMemcpyDeviceToHost, s.stream));
  R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void copy_device_to_device(Context& ctx, const Tensor& src, Tensor& dst) {
  State& s = ctx.cuda_state();
  R3_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice, s.stream));
  R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

double copy_bandwidth(Context& ctx) {
  State& s = ctx.cuda_state();
  const std::size_t bytes = std::size_t{2} << 30;
  void *src = nullptr, *dst = nullptr;
  R3_CUDA_CHECK(cudaMalloc(&src, bytes));
  std::unique_ptr<void, void (*)(void*)> src_owner(src, [](void* p) { cudaFree(p); });
  R3_CUDA_CHECK(cudaMalloc(&dst, bytes));
  std::unique_ptr<void, void (*)(void*)> dst_owner(dst, [](void* p) { cudaFree(p); });
  cudaEvent_t start = nullptr, stop = nullptr;
  R3_CUDA_CHECK(cudaEventCreate(&start));
  R3_CUDA_CHECK(cudaEventCreate(&stop));
  constexpr int kWarmup = 3, kReps = 20;
  for (int i = 0; i < kWarmup + kReps; ++i) {
    if (i == kWarmup) R3_CUDA_CHECK(cudaEventRecord(start, s.stream));
    R3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s.stream));
  }
  R3_CUDA_CHECK(cudaEventRecord(stop, s.stream));
  R3_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  R3_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) * kReps / (static_cast<double>(ms) * 1e-3);
}

int64_t free_bytes(Context& ctx) {
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  std::size_t free = 0, total = 0;
  R3_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

void synchronize(Context& ctx) { R3_CUDA_CHECK(cudaStreamSynchronize(ctx.cuda_state().stream)); }

void zero(Context& ctx, Tensor& t) {
  R3_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), ctx.cuda_state().stream));
}

}  // namespace r3::backend::cuda
