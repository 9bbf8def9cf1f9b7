// One expert's weights as bytes, for moving them between expert-parallel ranks when EPLB
// re-places the experts (moe/ep/expert_moves.h): gate, up and down in their stored dtype (float32,
// bfloat16, FP8 e4m3 with its block scales, MXFP4 with its e8m0 scales) and the optional biases.
// A received expert is the bytes the sender held, so it computes the bits it computed there.
//
// The format, all little-endian as the machine stores it: per tensor a presence byte, then dtype,
// rank, dims, the values (rows packed), a scale kind and the scales that cover the tensor's rows
// (FP8: the block grid's rows this tensor touches, and the tensor's first row inside the first of
// them; MXFP4: one byte per 32 values of each row). Any message that does not parse exactly is
// refused with the rank it came from.
#pragma once

#include <cstdint>

#include "moe/ep/transport.h"
#include "moe/physical_experts.h"

namespace r3::moe::ep {

// An upper bound of the bytes append_expert adds for these weights (to reserve a message at once).
std::size_t expert_bytes(const SwigluExpertWeights& weights);

// Appends physical expert `slot`'s weights to `out`.
void append_expert(Buffer& out, int32_t slot, const SwigluExpertWeights& weights);

// Reads the experts of one message in order; `source` (the sending rank) names it in errors.
class ExpertReader {
 public:
  ExpertReader(const Buffer& message, int source);
  bool done() const { return at_ == message_.size(); }
  // The next expert: its slot and weights (owned tensors, scales attached).
  std::pair<int32_t, SwigluExpertWeights> next();

 private:
  Tensor tensor();
  void read(void* dst, std::size_t bytes);
  template <typename T>
  T value() {
    T v;
    read(&v, sizeof v);
    return v;
  }

  const Buffer& message_;
  int source_;
  std::size_t at_ = 0;
};

}  // namespace r3::moe::ep
