// Embedding lookup: rows of a token table, in its stored dtype, widened to float32.
#pragma once

#include <cstdint>
#include <span>

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_embedding.cu
// The same lookup with the table, the `count` ids and out on the device.
void embedding_ids_on_device(backend::Context& ctx, const Tensor& table, const int32_t* ids, int64_t count,
                             Tensor& out);
}
#endif

// table: F32/BF16/F16, or F8_E4M3 with block scales (CPU) [vocab, hidden]; out: F32 [ids.size(), hidden]. Ids must be in the vocabulary.
inline void embedding(backend::Context& ctx, const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  R3_DISPATCH(ctx, embedding, table, ids, out);
}

}  // namespace r3::ops
