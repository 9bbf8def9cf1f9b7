// The execution context: everything a kernel needs besides its operands. On the CPU that is the
// thread pool and the step workspace; a CUDA context adds its device, stream and cuBLASLt handle
// with its workspace (backend/cuda/state.h). Ops and models take a Context instead of reaching
// for a device themselves, so a step runs wherever its context says.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "backend/workspace.h"
#include "core/device.h"
#include "core/thread_pool.h"

namespace r3::backend {

namespace cuda {
struct State;  // backend/cuda/state.h: device, stream, cuBLASLt handle (CUDA builds only)
struct KernelChoices;  // backend/cuda/kernel_choices.h
}

class Context {
 public:
  // A CPU context over `threads` (shared with whoever else uses the pool).
  explicit Context(ThreadPool& threads) : threads_(&threads) {}
  // A CPU context with a pool of its own (`threads` counts the calling thread; 0: one per core).
  explicit Context(int threads) : owned_threads_(std::make_unique<ThreadPool>(threads)), threads_(owned_threads_.get()) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();

  // A context on CUDA device `index` (its stream, cuBLASLt handle and workspace), with a
  // one-thread pool for host-side work. Throws when this build has no CUDA backend or the
  // machine no such device.
  static std::unique_ptr<Context> cuda(int index = 0);
  // Whether this build has the CUDA backend and the machine a CUDA device.
  static bool cuda_available();
  // How many CUDA devices the machine has (0 without the CUDA backend).
  static int cuda_device_count();

  Device device() const { return device_; }
  // Batch invariance: every op computes each row with a reduction order that does not depend on
  // the other rows of the step (how many there are, or which), so a request's results are the same
  // alone or batched. Always true of the CPU kernels; on CUDA it picks such kernels where the
  // fastest ones are not (cuBLASLt's float32 GEMMs, attention's chunk length), at a cost the
  // GPU benchmark measures.
  bool batch_invariant() const { return batch_invariant_ || device_ == Device::kCpu; }
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  // Reduced precision: the step belongs to a model placed for bfloat16 (--dtype bfloat16), so
  // quantized weights may take the tensor-core kernels, whose float32 activations are split into
  // two bfloat16 parts (about 16 significant bits), as bfloat16 weights always do. Off (float32
  // models: the parity runs), quantized weights keep float32 activations. A model sets it for
  // its steps (ReducedPrecisionScope): one context may serve models of both dtypes.
  bool reduced_precision() const { return reduced_precision_; }
  void set_reduced_precision(bool on) { reduced_precision_ = on; }
  // The CUDA state of a CUDA context (throws on a CPU context).
  cuda::State& cuda_state() const;
  // The kernel choices of a CUDA context (backend/cuda/kernel_choices.h), for experiments: one
  // choice by name ("rule", "always" or "never"; an unknown name or value throws, naming the known
  // ones), or all of them. Both throw on a CPU context.
  void set_kernel_choice(std::string_view name, std::string_view value);
  void set_kernel_choices(const cuda::KernelChoices& choices);
  ThreadPool& threads() const { return *threads_; }
  void parallel_for(int64_t n, int64_t grain, ThreadPool::RangeFn fn) const { threads_->parallel_for(n, grain, fn); }

  // Scratch of n values for each thread of the pool, from the workspace: inside a parallel loop,
  // mine() is the running thread's part.
  template <typename T>
  struct PerThread {
    T* base;
    int64_t n;
    std::span<T> mine() const {
      return {base + static_cast<int64_t>(ThreadPool::thread_index()) * n, static_cast<std::size_t>(n)};
    }
  };
  template <typename T>
  PerThread<T> per_thread(int64_t n) {
    return {workspace_.array<T>(n * threads_->size()).data(), n};
  }

  Workspace& workspace() { return workspace_; }
  // A zero-filled step tensor from the workspace (valid until the enclosing Workspace::Scope ends).
  Tensor scratch(DType dtype, Shape shape) { return workspace_.tensor(dtype, std::move(shape)); }
  // The same without the zero fill, for an output the next kernel writes in full.
  Tensor scratch_for_output(DType dtype, Shape shape) { return workspace_.tensor(dtype, std::move(shape), false); }

 private:
  std::unique_ptr<ThreadPool> owned_threads_;
  ThreadPool* threads_;
  Workspace workspace_;
  Device device_ = Device::kCpu;
  bool batch_invariant_ = false;
  bool reduced_precision_ = false;
  std::unique_ptr<cuda::State, void (*)(cuda::State*)> cuda_{nullptr, nullptr};
};

// Context::reduced_precision set for a scope (a model's step), the previous setting restored at
// its end.
class ReducedPrecisionScope {
 public:
  ReducedPrecisionScope(Context& ctx, bool on) : ctx_(ctx), before_(ctx.reduced_precision()) {
    ctx.set_reduced_precision(on);
  }
  ~ReducedPrecisionScope() { ctx_.set_reduced_precision(before_); }
  ReducedPrecisionScope(const ReducedPrecisionScope&) = delete;
  ReducedPrecisionScope& operator=(const ReducedPrecisionScope&) = delete;

 private:
  Context& ctx_;
  bool before_;
};

}  // namespace r3::backend
