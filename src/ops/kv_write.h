// Appending a step's key/value rows to the paged cache: row t goes to position writes[t].position
// of the sequence view writes[t].kv (ops/attention.h). Attention layers call it before they read
// the cache, so kernels only ever reach the cache through block tables.
#pragma once

#include <cstdint>
#include <span>

#include "backend/dispatch.h"
#include "ops/attention.h"

namespace r3::ops {

struct KvWrite {
  PagedKv kv;            // kv.keys == nullptr: nothing to write (a padding row)
  int64_t position = 0;
};

namespace cpu {
void write_kv(const float* keys, int64_t key_stride, const float* values, int64_t value_stride,
              std::span<const KvWrite> writes);
void write_kv_paged(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                    int64_t value_stride, const StepView& step, const KvPool& pool);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_paged_attention.cu
// write_kv_paged below, into a device pool.
void write_kv_paged(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                    int64_t value_stride, const StepView& step, const KvPool& pool);
}
#endif

// Row t's key is kv.key_width floats at keys + t * key_stride, its value kv.value_width floats at
// values + t * value_stride.
inline void write_kv(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                     int64_t value_stride, std::span<const KvWrite> writes) {
  R3_DISPATCH(ctx, write_kv, keys, key_stride, values, value_stride, writes);
}

// Row t (pointers on ctx's device, strides in floats) to position positions[t] of sequence
// seqs[t] in the pool, through the step's block tables (ops/step_view.h); padding rows (seq -1)
// write nothing.
inline void write_kv_paged(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                           int64_t value_stride, const StepView& step, const KvPool& pool) {
  R3_DISPATCH_GPU(ctx, write_kv_paged, ctx, keys, key_stride, values, value_stride, step, pool);
}

}  // namespace r3::ops
