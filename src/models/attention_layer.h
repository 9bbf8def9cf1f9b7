// The attention half of a decoder layer, whatever its kind (grouped-query, multi-head latent).
#pragma once

#include "core/tensor.h"
#include "backend/context.h"
#include "models/cache_spec.h"
#include "models/forward_batch.h"
#include "models/kv_cache.h"

namespace r3::models {

class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;
  // What this layer caches per position; the decoder builds its cache from these.
  virtual CacheSpec cache_spec() const = 0;
  // x: normalised hidden states F32 [tokens, hidden]; out: F32 [tokens, hidden]. Writes this
  // step's rows of `layer` into the cache, then attends causally over each token's sequence, both
  // through the cache's paged view of (layer, sequence).
  virtual void forward(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch, KvCache& cache, int64_t layer,
                       Tensor& out) const = 0;
};

}  // namespace r3::models
