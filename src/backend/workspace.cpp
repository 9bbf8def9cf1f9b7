#include "backend/workspace.h"

#include <cstring>

namespace r3::backend {

namespace {
// Every request is rounded to whole cache lines, so each buffer starts on one (what vector loads want).
std::size_t round_up(std::size_t n) { return (n + Workspace::kAlign - 1) / Workspace::kAlign * Workspace::kAlign; }
}  // namespace

std::size_t Workspace::capacity() const { return chunks_.empty() ? 0 : chunks_.back().begin + chunks_.back().size; }

void Workspace::add_chunk(std::size_t bytes) {
  Chunk chunk;
  chunk.size = round_up(bytes);
  chunk.begin = capacity();
  chunk.memory.reset(static_cast<std::byte*>(::operator new[](chunk.size, std::align_val_t(Workspace::kAlign))));
  chunks_.push_back(std::move(chunk));
  ++growths_;
}

void* Workspace::take(std::size_t bytes) {
  bytes = round_up(bytes == 0 ? 1 : bytes);
  // The chunk holding `top_`; a request never straddles two chunks, so skip to the next one
  // (or a new one) when the rest of this chunk is too short.
  for (;;) {
    for (Chunk& chunk : chunks_) {
      if (top_ >= chunk.begin && top_ < chunk.begin + chunk.size) {
        if (top_ + bytes <= chunk.begin + chunk.size) {
          std::byte* p = chunk.memory.get() + (top_ - chunk.begin);
          top_ += bytes;
          high_water_ = std::max(high_water_, top_);
          std::memset(p, 0, bytes);
          return p;
        }
        top_ = chunk.begin + chunk.size;  // the tail of this chunk stays unused
      }
    }
    if (top_ >= capacity()) add_chunk(std::max(bytes, capacity()));
  }
}

void Workspace::release(std::size_t mark) {
  top_ = mark;
  // Idle again with several chunks: merge them into one that holds the high water mark, so the
  // next steps (no larger than those seen) never grow.
  if (top_ == 0 && chunks_.size() > 1) {
    chunks_.clear();
    add_chunk(high_water_);
  }
}

void Workspace::reserve(std::size_t bytes) {
  if (top_ == 0 && capacity() < bytes) {
    chunks_.clear();
    add_chunk(bytes);
  }
}

Tensor Workspace::tensor(DType dtype, Shape shape) {
  for (int64_t d : shape) R3_CHECK(d >= 0, "negative dimension in shape ", shape_to_string(shape));
  void* data = take(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype));
  return Tensor::view(dtype, std::move(shape), data, nullptr);
}

}  // namespace r3::backend
