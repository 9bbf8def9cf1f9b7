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
// worker threads of the pool write into buffers taken before the parallel loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace r3::backend {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // A zero-filled contiguous host tensor, valid until the innermost open Scope ends.
  Tensor tensor(DType dtype, Shape shape);
  // An array of n value-initialised (zero) values, valid as long as a tensor would be. Nothing
  // runs at release, so T must be trivially destructible.
  template <typename T>
  std::span<T> array(int64_t n) {
    static_assert(std::is_trivially_destructible_v<T>, "workspace arrays are released without destructors");
    R3_CHECK(n >= 0, "workspace: negative array size ", n);
    T* p = static_cast<T*>(take(static_cast<std::size_t>(n) * sizeof(T)));
    std::uninitialized_value_construct_n(p, n);
    return {p, static_cast<std::size_t>(n)};
  }

  // Releases everything taken since it was opened.
  class Scope {
   public:
    explicit Scope(Workspace& workspace) : workspace_(workspace), mark_(workspace.mark()) {}
    ~Scope() { workspace_.release(mark_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Workspace& workspace_;
    std::size_t mark_;
  };

  // Makes the next `bytes` of requests (from idle) come without growing.
  void reserve(std::size_t bytes);
  std::size_t capacity() const;
  std::size_t high_water() const { return high_water_; }
  // How many times the workspace had to allocate memory (tests: stays flat once warmed up).
  int64_t growths() const { return growths_; }

  // Chunks are cache-line aligned: they come from the aligned operator new[], so they must go
  // back through the aligned operator delete[].
  static constexpr std::size_t kAlign = 64;

 private:
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(kAlign)); }
  };
  struct Chunk {
    std::unique_ptr<std::byte[], AlignedDelete> memory;
    std::size_t size = 0;
    std::size_t begin = 0;  // offset of the chunk's first byte in the workspace's address space
  };
  void* take(std::size_t bytes);
  std::size_t mark() const { return top_; }
  void release(std::size_t mark);
  void add_chunk(std::size_t bytes);

  std::vector<Chunk> chunks_;
  std::size_t top_ = 0;  // bytes in use, in the concatenated address space of the chunks
  std::size_t high_water_ = 0;
  int64_t growths_ = 0;
};

}  // namespace r3::backend
