// A check on logits before anything samples, prints or returns them.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace r3::engine {

// Fails, naming the first bad row and token, when F32 logits [rows, V] hold a NaN or an infinity:
// NaN weights, or activations that overflow, make them, and sampling from them would return a
// meaningless token with exit 0. Row r is the logits at sequence position first_position + r.
// Weights are not scanned at load: that reads every byte of a checkpoint (hundreds of GB for
// the models r3 serves) before the first token, while a bad weight that is ever used shows here.
void check_finite_logits(const Tensor& logits, int64_t first_position);

}  // namespace r3::engine
