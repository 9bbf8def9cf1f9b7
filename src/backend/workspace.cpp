#include "backend/workspace.h"

#include <cstring>
#include <new>

namespace r3::backend {

namespace {
// Every request is rounded to whole cache lines, so each buffer starts on one (what vector loads want).
std::size_t round_up(std::size_t n) { return (n + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign; }
}  // namespace

Arena::~Arena() { free_chunks(); }

void Arena::free_chunks() {
  for (Chunk& chunk : chunks_) {
    if (memory_.free != nullptr) memory_.free(chunk.memory, memory_.state);
    else ::operator delete[](chunk.memory, std::align_val_t(kAlign));
  }
  chunks_.clear();
}

std::size_t Arena::capacity() const { return chunks_.empty() ? 0 : chunks_.back().begin + chunks_.back().size; }

void Arena::add_chunk(std::size_t bytes) {
  Chunk chunk;
  chunk.size = round_up(bytes);
  chunk.begin = capacity();
  chunk.memory = static_cast<std::byte*>(memory_.allocate != nullptr
                                             ? memory_.allocate(chunk.size, memory_.state)
                                             : ::operator new[](chunk.size, std::align_val_t(kAlign)));
  chunks_.push_back(chunk);
  ++growths_;
}

void* Arena::take(std::size_t bytes, bool zero) {
  bytes = round_up(bytes == 0 ? 1 : bytes);
  // The chunk holding `top_`; a request never straddles two chunks, so skip to the next one
  // (or a new one) when the rest of this chunk is too short.
  for (;;) {
    for (Chunk& chunk : chunks_) {
      if (top_ >= chunk.begin && top_ < chunk.begin + chunk.size) {
        if (top_ + bytes <= chunk.begin + chunk.size) {
          std::byte* p = chunk.memory + (top_ - chunk.begin);
          top_ += bytes;
          high_water_ = std::max(high_water_, top_);
          if (!zero) return p;
          if (memory_.zero != nullptr) memory_.zero(p, bytes, memory_.state);
          else std::memset(p, 0, bytes);
          return p;
        }
        top_ = chunk.begin + chunk.size;  // the tail of this chunk stays unused
      }
    }
    if (top_ >= capacity()) add_chunk(std::max(bytes, capacity()));
  }
}

void Arena::release(std::size_t mark) {
  top_ = mark;
  // Idle again with several chunks: merge them into one that holds the high water mark, so the
  // next steps (no larger than those seen) never grow.
  if (top_ == 0 && chunks_.size() > 1) {
    free_chunks();
    add_chunk(high_water_);
  }
}

void Arena::reserve(std::size_t bytes) {
  if (top_ == 0 && capacity() < bytes) {
    free_chunks();
    add_chunk(bytes);
  }
}

void Workspace::place_tensors(ArenaMemory memory) {
  R3_CHECK(host_.mark() == 0 && (!device_ || device_->mark() == 0), "workspace: placed while in use");
  device_ = std::make_unique<Arena>(memory);
}

Tensor Workspace::tensor(DType dtype, Shape shape, bool zero) {
  for (int64_t d : shape) R3_CHECK(d >= 0, "negative dimension in shape ", shape_to_string(shape));
  Arena& arena = tensor_arena();
  void* data = arena.take(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype), zero);
  return Tensor::view(dtype, std::move(shape), data, nullptr, Storage::kView, arena.device());
}

}  // namespace r3::backend
