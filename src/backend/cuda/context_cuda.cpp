// The CUDA side of backend::Context: creating a context on a device and its state.
#include "backend/context.h"

#include "backend/cuda/state.h"

namespace r3::backend {

namespace cuda {

void check(cudaError_t status, const char* what) {
  R3_CHECK(status == cudaSuccess, "CUDA: ", what, ": ", cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  R3_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt: ", what, ": status ", static_cast<int>(status));
}

namespace {

// 32 MiB: what cuBLASLt's heuristics ask for at most on Hopper for the GEMM shapes r3 runs.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;

// The workspace's tensors in device memory: allocated and freed with the runtime, zeroed by a
// memset queued on the context's stream (ordered before the kernels that use them).
// On the context's device whatever the calling thread's current one (expert-parallel ranks on
// several GPUs run on threads of their own).
void* allocate_device(std::size_t bytes, void* state) {
  void* p = nullptr;
  R3_CUDA_CHECK(cudaSetDevice(static_cast<State*>(state)->device));
  R3_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void free_device(void* p, void*) { cudaFree(p); }
void zero_device(void* p, std::size_t bytes, void* state) {
  R3_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, static_cast<State*>(state)->stream));
}

void destroy(State* s) {
  if (s == nullptr) return;
  cudaSetDevice(s->device);
  if (s->lt_workspace != nullptr) cudaFree(s->lt_workspace);
  if (s->lt != nullptr) cublasLtDestroy(s->lt);
  if (s->side != nullptr) cudaStreamDestroy(s->side);
  if (s->fork != nullptr) cudaEventDestroy(s->fork);
  if (s->join != nullptr) cudaEventDestroy(s->join);
  if (s->stream != nullptr) cudaStreamDestroy(s->stream);
  delete s;
}

}  // namespace
}  // namespace cuda

bool Context::cuda_available() { return cuda_device_count() > 0; }

int Context::cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::unique_ptr<Context> Context::cuda(int index) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  R3_CHECK(status == cudaSuccess && count > 0, "--device cuda: no CUDA device (",
           status == cudaSuccess ? "none found" : cudaGetErrorString(status), ")");
  R3_CHECK(index >= 0 && index < count, "--device cuda: device ", index, " does not exist (", count, " found)");
  auto ctx = std::make_unique<Context>(1);
  ctx->device_ = Device::kCuda;
  ctx->cuda_ = {new cuda::State, &cuda::destroy};
  cuda::State& s = *ctx->cuda_;
  s.device = index;
  R3_CUDA_CHECK(cudaSetDevice(index));
  R3_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_count, cudaDevAttrMultiProcessorCount, index));
  R3_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  R3_CUDA_CHECK(cublasLtCreate(&s.lt));
  R3_CUDA_CHECK(cudaMalloc(&s.lt_workspace, cuda::kLtWorkspaceBytes));
  s.lt_workspace_bytes = cuda::kLtWorkspaceBytes;
  ctx->workspace_.place_tensors({Device::kCuda, &cuda::allocate_device, &cuda::free_device, &cuda::zero_device, &s});
  return ctx;
}

cuda::State& Context::cuda_state() const {
  R3_CHECK(cuda_ != nullptr, "not a CUDA context");
  return *cuda_;
}

void Context::set_kernel_choice(std::string_view name, std::string_view value) {
  R3_CHECK(cuda_ != nullptr, "kernel choices apply to a CUDA context");
  cuda_->choices.set(name, value);
}

void Context::set_kernel_choices(const cuda::KernelChoices& choices) {
  R3_CHECK(cuda_ != nullptr, "kernel choices apply to a CUDA context");
  cuda_->choices = choices;
}

}  // namespace r3::backend
