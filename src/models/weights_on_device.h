// A host model's weights on a device: each placed as the model's dtype (float weights) or as
// stored (FP8 with block scales, MXFP4: never widened), and the projections a layer runs as one
// stacked into one matrix. On a CPU context the copies are host tensors.
#pragma once

#include <initializer_list>

#include "backend/context.h"
#include "core/tensor.h"
#include "models/swiglu_mlp.h"

namespace r3::models {

// A host weight on ctx's device as `dtype`, or an undefined tensor for an absent optional weight.
Tensor on_device(backend::Context& ctx, const Tensor& host, DType dtype);

// Host matrices (or vectors) of one width as one of their rows stacked, on the device as `dtype`:
// float weights always (widened exactly first), quantized ones when they are FP8 whose block
// scales stack (each part starting and ending on a block row); an undefined tensor otherwise
// (they then stay apart).
Tensor stacked_on_device(backend::Context& ctx, std::initializer_list<const Tensor*> parts, DType dtype);

// A host MLP with its matrices on the device as `dtype` (SwigluMlp's forward runs wherever its
// context does).
SwigluMlp mlp_on_device(backend::Context& ctx, const SwigluMlp& host, DType dtype);

}  // namespace r3::models
