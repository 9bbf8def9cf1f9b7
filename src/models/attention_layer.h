// The attention half of a decoder layer, whatever its kind (grouped-query, multi-head latent).
#pragma once

#include <memory>

#include "core/tensor.h"
#include "backend/context.h"
#include "models/cache_spec.h"
#include "models/kv_cache.h"
#include "ops/step_view.h"

namespace r3::models {

class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;
  // What this layer caches per position; the decoder builds its cache from these.
  virtual CacheSpec cache_spec() const = 0;
  // This layer with its weights on ctx's device (projections as `dtype`, or as stored when
  // quantized; norms, biases and gates float32), refused by name where the device cannot run it.
  virtual std::unique_ptr<AttentionLayer> placed(backend::Context& ctx, DType dtype) const = 0;
  // x: normalised hidden states F32 [tokens, hidden]; out: F32 [tokens, hidden]; step: the
  // step's metadata in the memory of ctx's device (ForwardBatch::view on the host). Writes this
  // step's rows of `layer` into the cache, then attends causally over each token's sequence, both
  // through the cache's block tables.
  virtual void forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache,
                       int64_t layer, Tensor& out) const = 0;
};

}  // namespace r3::models
