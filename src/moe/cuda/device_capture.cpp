#include "moe/device_capture.h"

#include "backend/cuda/state.h"
#include "core/checked.h"

namespace r3::moe {

struct DeviceCaptureBuffer::Impl {
  int32_t* rows = nullptr;         // device [max_tokens, layers, k]
  int32_t* host = nullptr;         // pinned [max_tokens, layers, k]
  float* weights = nullptr;        // device [layers, tokens, k] of the step (max_tokens rows of room)
  float* host_weights = nullptr;   // pinned, the same layout
  float* margins = nullptr;        // device [max_tokens, layers]
  float* host_margins = nullptr;   // pinned, the same
  cudaStream_t side = nullptr;     // the copy's stream
  cudaEvent_t step_done = nullptr;  // recorded on the context's stream at end_step
  cudaEvent_t copied = nullptr;     // recorded on the side stream after the copy

  ~Impl() {
    if (copied) cudaEventDestroy(copied);
    if (step_done) cudaEventDestroy(step_done);
    if (side) cudaStreamDestroy(side);
    if (host_margins) cudaFreeHost(host_margins);
    if (margins) cudaFree(margins);
    if (host_weights) cudaFreeHost(host_weights);
    if (weights) cudaFree(weights);
    if (host) cudaFreeHost(host);
    if (rows) cudaFree(rows);
  }
};

DeviceCaptureBuffer::DeviceCaptureBuffer(backend::Context& ctx, int64_t max_tokens, int64_t moe_layers, int64_t top_k)
    : ctx_(ctx), max_tokens_(max_tokens), layers_(moe_layers), k_(top_k), impl_(std::make_unique<Impl>()) {
  R3_CHECK(max_tokens > 0 && moe_layers > 0 && top_k > 0, "device capture buffer: ", max_tokens, " tokens x ",
           moe_layers, " layers x ", top_k);
  const std::size_t bytes = checked_mul(
      checked_mul(static_cast<std::size_t>(max_tokens), static_cast<std::size_t>(moe_layers), "capture rows"),
      static_cast<std::size_t>(top_k) * sizeof(int32_t), "capture bytes");
  R3_CUDA_CHECK(cudaSetDevice(ctx.cuda_state().device));
  R3_CUDA_CHECK(cudaMalloc(&impl_->rows, bytes));
  R3_CUDA_CHECK(cudaMallocHost(&impl_->host, bytes));
  static_assert(sizeof(float) == sizeof(int32_t));
  R3_CUDA_CHECK(cudaMalloc(&impl_->weights, bytes));
  R3_CUDA_CHECK(cudaMallocHost(&impl_->host_weights, bytes));
  const auto margin_bytes = static_cast<std::size_t>(max_tokens * moe_layers) * sizeof(float);
  R3_CUDA_CHECK(cudaMalloc(&impl_->margins, margin_bytes));
  R3_CUDA_CHECK(cudaMallocHost(&impl_->host_margins, margin_bytes));
  R3_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->side, cudaStreamNonBlocking));
  R3_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->step_done, cudaEventDisableTiming));
  R3_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->copied, cudaEventDisableTiming));
}

DeviceCaptureBuffer::~DeviceCaptureBuffer() = default;

DeviceCaptureRows DeviceCaptureBuffer::layer_rows(int64_t moe_layer) const {
  R3_CHECK(moe_layer >= 0 && moe_layer < layers_, "device capture: MoE layer ", moe_layer, " of ", layers_);
  return {impl_->rows + moe_layer * k_, layers_ * k_, impl_->margins + moe_layer, layers_};
}

float* DeviceCaptureBuffer::layer_weights(int64_t moe_layer, int64_t tokens) const {
  R3_CHECK(moe_layer >= 0 && moe_layer < layers_ && tokens >= 0 && tokens <= max_tokens_, "device capture: MoE layer ",
           moe_layer, " of ", layers_, ", ", tokens, " tokens (room for ", max_tokens_, ")");
  return impl_->weights + moe_layer * tokens * k_;  // a step's layers are packed at its size
}

void DeviceCaptureBuffer::begin_step() {
  if (pending_tokens_ >= 0) R3_CUDA_CHECK(cudaStreamWaitEvent(ctx_.cuda_state().stream, impl_->copied, 0));
}

void DeviceCaptureBuffer::end_step(int64_t tokens) {
  R3_CHECK(tokens >= 0 && tokens <= max_tokens_, "device capture: a step of ", tokens, " tokens (room for ",
           max_tokens_, ")");
  R3_CUDA_CHECK(cudaEventRecord(impl_->step_done, ctx_.cuda_state().stream));
  R3_CUDA_CHECK(cudaStreamWaitEvent(impl_->side, impl_->step_done, 0));
  const auto bytes = static_cast<std::size_t>(tokens * layers_ * k_) * sizeof(int32_t);
  if (bytes > 0) {
    R3_CUDA_CHECK(cudaMemcpyAsync(impl_->host, impl_->rows, bytes, cudaMemcpyDeviceToHost, impl_->side));
    R3_CUDA_CHECK(cudaMemcpyAsync(impl_->host_weights, impl_->weights, bytes, cudaMemcpyDeviceToHost, impl_->side));
    R3_CUDA_CHECK(cudaMemcpyAsync(impl_->host_margins, impl_->margins,
                                  static_cast<std::size_t>(tokens * layers_) * sizeof(float), cudaMemcpyDeviceToHost,
                                  impl_->side));
  }
  R3_CUDA_CHECK(cudaEventRecord(impl_->copied, impl_->side));
  pending_tokens_ = tokens;
}

std::span<const int32_t> DeviceCaptureBuffer::collect() {
  R3_CHECK(pending_tokens_ >= 0, "device capture: collect() before end_step()");
  R3_CUDA_CHECK(cudaEventSynchronize(impl_->copied));
  return {impl_->host, static_cast<std::size_t>(pending_tokens_ * layers_ * k_)};
}

std::span<const float> DeviceCaptureBuffer::collected_weights() const {
  R3_CHECK(pending_tokens_ >= 0, "device capture: collected_weights() before end_step()");
  return {impl_->host_weights, static_cast<std::size_t>(pending_tokens_ * layers_ * k_)};
}

std::span<const float> DeviceCaptureBuffer::collected_margins() const {
  R3_CHECK(pending_tokens_ >= 0, "device capture: collected_margins() before end_step()");
  return {impl_->host_margins, static_cast<std::size_t>(pending_tokens_ * layers_)};
}

}  // namespace r3::moe
