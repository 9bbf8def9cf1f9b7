#include "gpu/gpu_test_support.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/cuda/state.h"
#include "backend/device_memory.h"

namespace r3::test {

Tensor gpu_random(Shape shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

double gpu_relative_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

double gpu_relative_error(const Tensor& a, const Tensor& b) {
  return gpu_relative_error(a.data<float>(), b.data<float>(), b.numel());
}

Tensor gpu_ints(backend::Context& gpu, const std::vector<int32_t>& values) {
  return backend::to_device(gpu, Tensor::from(values, {static_cast<int64_t>(values.size())}));
}

std::vector<std::string> kernels_launched(backend::Context& gpu, const std::function<void()>& work) {
  const cudaStream_t stream = gpu.cuda_state().stream;
  R3_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  R3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  work();
  R3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  std::size_t n = 0;
  R3_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  R3_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<std::string> names;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    R3_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams params{};
    R3_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &params));
    const char* name = nullptr;
    R3_CUDA_CHECK(cudaFuncGetName(&name, params.func));
    names.emplace_back(name);
  }
  cudaGraphExec_t exec = nullptr;
  R3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  R3_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  R3_CUDA_CHECK(cudaStreamSynchronize(stream));
  R3_CUDA_CHECK(cudaGraphExecDestroy(exec));
  R3_CUDA_CHECK(cudaGraphDestroy(graph));
  return names;
}

}  // namespace r3::test
