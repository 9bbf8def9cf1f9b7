// y = x · wᵀ (+ bias) on the GPU. Float32 weights (the parity mode) go through cuBLASLt, float32
// in and out with float32 accumulation and no TF32, unless the context is batch invariant;
// bfloat16 weights, and float32 ones then, through r3's own weight-streaming kernel
// (ops/cuda/linear_rows.h), which keeps the activations float32. cuBLASLt is column-major: row-major y
// [m, n] is column-major [n, m], so it computes yᵀ = w · xᵀ with w, stored row-major [n, k], read
// as the transpose of a column-major [k, n] matrix. The bias rides on the GEMM's epilogue.
#include <algorithm>

#include "backend/cuda/state.h"
#include "ops/cuda/linear_rows.h"
#include "ops/linear.h"

namespace r3::ops::cuda {

namespace {

// cuBLASLt descriptors freed on every path.
struct LtMatmul {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtMatmul() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

void linear(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  R3_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2, "linear (cuda): rank-2 tensors expected");
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  R3_CHECK(w.dim(1) == k && y.dim(0) == m && y.dim(1) == n, "linear (cuda): x ", shape_to_string(x.shape()), " w ",
           shape_to_string(w.shape()), " y ", shape_to_string(y.shape()));
  R3_CHECK(x.dtype() == DType::F32 && (w.dtype() == DType::F32 || w.dtype() == DType::BF16) &&
               y.dtype() == DType::F32,
           "linear (cuda): float32 activations and float32 or bfloat16 weights expected, got weights of ",
           dtype_name(w.dtype()));
  R3_CHECK(x.device() == Device::kCuda && w.device() == Device::kCuda && y.device() == Device::kCuda &&
               (bias == nullptr || bias->device() == Device::kCuda),
           "linear (cuda): tensors must be on the device");
  R3_CHECK(x.is_contiguous() && w.is_contiguous() && y.is_contiguous(), "linear (cuda): contiguous tensors expected");
  R3_CHECK(bias == nullptr || (bias->rank() == 1 && bias->dim(0) == n), "linear (cuda): bias shape");
  if (m == 0 || n == 0) return;
  // cuBLASLt picks its algorithm (and so its reduction order) by the matrix sizes, rows included.
  if (w.dtype() == DType::BF16 || ctx.batch_invariant()) return linear_rows(ctx, x, w, bias, y);
  const auto& s = ctx.cuda_state();
  LtMatmul lt;
  R3_CUDA_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const void* bias_ptr = bias->raw_data();
    R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  R3_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_32F, u(k), u(n), k));  // w: column-major [k, n]
  R3_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_32F, u(k), u(m), k));  // x: column-major [k, m]
  R3_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_32F, u(n), u(m), n));  // y: column-major [n, m]
  R3_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&lt.pref));
  R3_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &s.lt_workspace_bytes, sizeof(s.lt_workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  R3_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(s.lt, lt.op, lt.a, lt.b, lt.c, lt.c, lt.pref, 1, &heuristic, &found));
  R3_CHECK(found > 0, "linear (cuda): cuBLASLt has no algorithm for [", m, ", ", k, "] x [", n, ", ", k, "]");
  const float one = 1.0f, zero = 0.0f;
  R3_CUDA_CHECK(cublasLtMatmul(s.lt, lt.op, &one, w.raw_data(), lt.a, x.raw_data(), lt.b, &zero, y.raw_data(), lt.c,
                               y.raw_data(), lt.c, &heuristic.algo, s.lt_workspace, s.lt_workspace_bytes, s.stream));
}

}  // namespace r3::ops::cuda
