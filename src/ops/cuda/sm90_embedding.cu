// Embedding lookup on the GPU: one block per token copies its table row, widened to float32 from
// the stored dtype (bf16/f16 widening is exact). Token ids come from the step's device metadata;
// an id outside the vocabulary writes NaN into its row, which the logits check then reports
// (the host validated the ids before the step; this only keeps a bad id from reading out of bounds).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/embedding.h"

namespace r3::ops::cuda {

namespace {

template <typename T>
__device__ inline float widen(T v);
template <> __device__ inline float widen(float v) { return v; }
template <> __device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ inline float widen(__half v) { return __half2float(v); }

template <typename T>
__global__ void gather_rows(const T* __restrict__ table, int64_t vocab, int64_t hidden, const int32_t* __restrict__ ids,
                            float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * hidden;
  const bool valid = id >= 0 && id < vocab;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = valid ? widen(table[id * hidden + i]) : NAN;
}

}  // namespace

void embedding_ids_on_device(backend::Context& ctx, const Tensor& table, const int32_t* ids, int64_t count,
                             Tensor& out) {
  R3_CHECK(table.rank() == 2 && table.is_contiguous() && table.device() == Device::kCuda, "embedding (cuda): table must be a [vocab, hidden] device tensor");
  const int64_t vocab = table.dim(0), hidden = table.dim(1);
  R3_CHECK(out.rank() == 2 && out.dim(0) == count && out.dim(1) == hidden && out.device() == Device::kCuda,
           "embedding (cuda): out ", shape_to_string(out.shape()), " for ", count, " ids of width ", hidden);
  if (count == 0) return;
  const cudaStream_t stream = ctx.cuda_state().stream;
  const auto blocks = static_cast<unsigned>(count);
  switch (table.dtype()) {
    case DType::F32:
      backend::cuda::launch_kernel(gather_rows<float>, blocks, 256, 0, stream, table.data<float>(), vocab, hidden, ids,
                                   out.data<float>());
      break;
    case DType::BF16:
      backend::cuda::launch_kernel(gather_rows<__nv_bfloat16>, blocks, 256, 0, stream,
                                   static_cast<const __nv_bfloat16*>(table.raw_data()), vocab, hidden, ids,
                                   out.data<float>());
      break;
    case DType::F16:
      backend::cuda::launch_kernel(gather_rows<__half>, blocks, 256, 0, stream,
                                   static_cast<const __half*>(table.raw_data()), vocab, hidden, ids, out.data<float>());
      break;
    default:
      R3_FAIL("embedding (cuda): table of dtype ", dtype_name(table.dtype()), " (expected F32, BF16 or F16)");
  }
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
