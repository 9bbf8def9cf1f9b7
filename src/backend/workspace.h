// Scratch memory for one step: a stack of bump-allocated regions that kernels and layers take
// their buffers from, released in LIFO order by Scope objects.
//
// A step's buffers depend only on (tokens, sequences) of the step, so after the largest step has
// run once the workspace holds enough for every later step and hands out memory without
// touching the heap; that is what makes a warmed-up decode step allocation-free. Growth is
// chunked (a new chunk never moves tensors already handed out); when the workspace is idle again
// the chunks are merged into one of the high-water size. reserve() sizes it up front.
//
// One workspace belongs to one execution context and is used by the thread that runs the step;
// worker threads of the pool write into buffers taken before the parallel loop. On a CUDA
// context the tensors come from device memory, the arrays (step metadata built on the host)
// from host memory; one Scope releases both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace r3::backend {

// Where the memory of an Arena comes from: the host heap by default; a CUDA context gives its
// workspace's tensors device memory through these (backend/cuda), keeping this file free of CUDA.
struct ArenaMemory {
  Device device = Device::kCpu;
  void* (*allocate)(std::size_t bytes, void* state) = nullptr;  // nullptr: the host heap
  void (*free)(void* p, void* state) = nullptr;
  void (*zero)(void* p, std::size_t bytes, void* state) = nullptr;  // e.g. a memset queued on a stream
  void* state = nullptr;
};

// One bump-allocated stack of chunks (the mechanism behind Workspace).
class Arena {
 public:
  explicit Arena(ArenaMemory memory = {}) : memory_(memory) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  void* take(std::size_t bytes, bool zero = true);  // kAlign-aligned; zero-filled unless asked not to
  std::size_t mark() const { return top_; }
  void release(std::size_t mark);
  void reserve(std::size_t bytes);
  std::size_t capacity() const;
  std::size_t high_water() const { return high_water_; }
  int64_t growths() const { return growths_; }
  Device device() const { return memory_.device; }

  // Chunks are cache-line aligned (device allocations are at least that).
  static constexpr std::size_t kAlign = 64;

 private:
  struct Chunk {
    std::byte* memory = nullptr;
    std::size_t size = 0;
    std::size_t begin = 0;  // offset of the chunk's first byte in the arena's address space
  };
  void add_chunk(std::size_t bytes);
  void free_chunks();

  ArenaMemory memory_;
  std::vector<Chunk> chunks_;
  std::size_t top_ = 0;  // bytes in use, in the concatenated address space of the chunks
  std::size_t high_water_ = 0;
  int64_t growths_ = 0;
};

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Tensors from now on live on `memory.device` (a CUDA context calls this once, idle); arrays
  // stay on the host, where the step's metadata is built.
  void place_tensors(ArenaMemory memory);

  // A zero-filled contiguous tensor on the workspace's tensor device, valid until the innermost
  // open Scope ends; with zero = false its values are whatever was there (for outputs a kernel
  // writes in full: no fill to queue).
  Tensor tensor(DType dtype, Shape shape, bool zero = true);
  // A host array of n value-initialised (zero) values, valid as long as a tensor would be.
  // Nothing runs at release, so T must be trivially destructible.
  template <typename T>
  std::span<T> array(int64_t n) {
    static_assert(std::is_trivially_destructible_v<T>, "workspace arrays are released without destructors");
    R3_CHECK(n >= 0, "workspace: negative array size ", n);
    T* p = static_cast<T*>(host_.take(static_cast<std::size_t>(n) * sizeof(T)));
    std::uninitialized_value_construct_n(p, n);
    return {p, static_cast<std::size_t>(n)};
  }

  // Releases everything taken since it was opened (host arrays and tensors alike).
  class Scope {
   public:
    explicit Scope(Workspace& workspace)
        : workspace_(workspace), host_mark_(workspace.host_.mark()), tensor_mark_(workspace.tensor_arena().mark()) {}
    ~Scope() {
      workspace_.host_.release(host_mark_);
      workspace_.tensor_arena().release(tensor_mark_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Workspace& workspace_;
    std::size_t host_mark_, tensor_mark_;
  };

  // Host memory: makes the next `bytes` of requests (from idle) come without growing.
  void reserve(std::size_t bytes) { host_.reserve(bytes); }
  std::size_t capacity() const { return host_.capacity(); }
  std::size_t high_water() const { return host_.high_water(); }
  // How many times the workspace had to allocate memory, host and device (tests: stays flat
  // once warmed up).
  int64_t growths() const { return host_.growths() + (device_ ? device_->growths() : 0); }

  static constexpr std::size_t kAlign = Arena::kAlign;

 private:
  Arena& tensor_arena() { return device_ ? *device_ : host_; }

  Arena host_;
  std::unique_ptr<Arena> device_;  // tensors' memory when placed on a device
};

}  // namespace r3::backend
