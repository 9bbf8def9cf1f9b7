// A block-diagonal projection (DeepSeek-V4's grouped low-rank output): the input row is split
// into `groups` equal slices, and slice g goes through its own rows of w.
#pragma once

#include "core/tensor.h"

namespace r3::ops {

// x: F32 [tokens, groups * in]; w: F32 [groups * out, in] (group g's rows g*out .. g*out+out-1);
// y: F32 [tokens, groups * out].
void grouped_projection(const Tensor& x, const Tensor& w, int64_t groups, Tensor& y);

}  // namespace r3::ops
