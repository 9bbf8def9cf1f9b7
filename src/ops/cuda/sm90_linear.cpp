// y = x · wᵀ (+ bias) on the GPU, five ways:
// - float32 weights (the parity mode) through cuBLASLt, float32 in and out with float32
//   accumulation and no TF32, or for a few rows through r3's weight-streaming kernel (the
//   routers' float32 weights at decode, whose 1 MB is too little to pay for cuBLASLt's fixed
//   cost);
// - bfloat16 weights with up to 4 rows through the weight-streaming kernel (ops/cuda/linear_rows.h),
//   which reads every weight once and keeps the activations float32 (at so few rows it measured
//   faster than the tensor-core rows kernel: bench/RESULTS.md);
// - bfloat16 weights with 5 to kMmaRows rows through r3's tensor-core rows kernel
//   (ops/cuda/linear_mma_rows.h), which reads every weight once, where the weight-streaming
//   kernel re-reads the activations for every weight row;
// - bfloat16 weights with more rows through cuBLASLt on tensor cores, the float32 activations
//   split into high and low bfloat16 parts (ops/cuda/split_bf16.h).
// - FP8 and MXFP4 weights (published quantized checkpoints) with up to kMmaRows rows through the
//   weight-streaming kernel, which decodes them in registers; with more rows, decoded into float32
//   scratch for cuBLASLt in float32. In a step of reduced precision (a model placed for bfloat16:
//   Context::reduced_precision) three things change:
//   - FP8 weights of 5 to kMmaRowsQuantized rows take the tensor-core rows kernel, widened exactly
//     to bfloat16 (the weight-streaming kernel re-reads the activations for every weight row, and
//     the float32 GEMM on decoded weights runs without tensor cores: docs/performance.md);
//   - quantized weights with more rows (prefill), or that kernel cannot take (MXFP4), are decoded
//     straight into high and low bfloat16 parts, split as the activations are, and multiplied
//     on bfloat16 tensor cores: x_hi·w_hi + x_lo·w_hi + x_hi·w_lo, the one product dropped being
//     below both parts' rounding (split_operands_matmul).
// A batch-invariant context takes the weight-streaming kernel for all of them: cuBLASLt picks its
// algorithm, and so its reduction order, by the matrix sizes, rows included.
// cuBLASLt is column-major: row-major y [m, n] is column-major [n, m], so it computes
// yᵀ = w · xᵀ with w, stored row-major [n, k], read as the transpose of a column-major [k, n]
// matrix. The bias rides on the GEMM's epilogue.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/state.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/linear_mma_rows.h"
#include "ops/cuda/linear_rows.h"
#include "ops/cuda/split_bf16.h"
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

// y [m, n] F32 = x [m, k] · w [n, k]ᵀ (+ bias) through cuBLASLt, x and w of `inputs` (float32 or
// bfloat16), float32 accumulation; with `accumulate`, y += x · wᵀ.
void lt_matmul(backend::Context& ctx, cudaDataType_t inputs, const void* x, int64_t m, int64_t k, const void* w,
               int64_t n, const float* bias, float* y, bool accumulate = false) {
  const auto& s = ctx.cuda_state();
  LtMatmul lt;
  R3_CUDA_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    R3_CUDA_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  R3_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lt.a, inputs, u(k), u(n), k));     // w: column-major [k, n]
  R3_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lt.b, inputs, u(k), u(m), k));     // x: column-major [k, m]
  R3_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_32F, u(n), u(m), n));  // y: column-major [n, m]
  R3_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&lt.pref));
  R3_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &s.lt_workspace_bytes, sizeof(s.lt_workspace_bytes)));
  // cuBLASLt assumes 256-byte aligned buffers unless told otherwise; views (a row range of a
  // weight) may start anywhere, so it is told each buffer's actual alignment.
  const auto alignment = [](const void* p) {
    uint32_t bytes = 256;
    while (bytes > 1 && reinterpret_cast<uintptr_t>(p) % bytes != 0) bytes /= 2;
    return bytes;
  };
  const uint32_t align_w = alignment(w), align_x = alignment(x), align_y = alignment(y);
  R3_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w,
                                                     sizeof(align_w)));
  R3_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x,
                                                     sizeof(align_x)));
  R3_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y,
                                                     sizeof(align_y)));
  R3_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y,
                                                     sizeof(align_y)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  R3_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(s.lt, lt.op, lt.a, lt.b, lt.c, lt.c, lt.pref, 1, &heuristic, &found));
  R3_CHECK(found > 0, "linear (cuda): cuBLASLt has no algorithm for [", m, ", ", k, "] x [", n, ", ", k, "]");
  const float one = 1.0f, zero = 0.0f;
  R3_CUDA_CHECK(cublasLtMatmul(s.lt, lt.op, &one, w, lt.a, x, lt.b, accumulate ? &one : &zero, y, lt.c, y, lt.c,
                               &heuristic.algo, s.lt_workspace, s.lt_workspace_bytes, s.stream));
}

// The most rows the weight-streaming kernel takes for float32 weights (one pass over them); above,
// cuBLASLt.
constexpr int64_t kStreamingRows = 8;
// The most rows it takes for bfloat16 weights; above, the tensor-core rows kernel.
constexpr int64_t kStreamingRowsBf16 = 4;
// The most rows the tensor-core rows kernel takes: above, each further block of rows reads the
// weights again, so cuBLASLt measured faster there (bench/RESULTS.md), and one 16-row tile per warp
// leaves the smaller projections with too few warps in flight.
constexpr int64_t kMmaRows = 16;
// The most rows it takes for FP8 weights in a step of reduced precision. Each further block of 32
// rows reads the weights again, from L2 when they fit (Qwen3-30B-A3B's FP8 q/k/v: 10.5 MB); by
// 256 rows the split operands' GEMM (below) has caught up with it (bench/RESULTS.md), so larger
// steps take that.
constexpr int64_t kMmaRowsQuantized = 256;

// y = x · wᵀ (+ bias) for quantized w in a step of reduced precision: w decoded straight into
// high and low bfloat16 parts, x split the same way (each value = hi + lo to about 16
// significant bits); [x_hi; x_lo]·w_hiᵀ in one GEMM, x_hi·w_loᵀ added onto its first half, and
// the halves summed. The product x_lo·w_lo is below both splits' rounding and left out.
void split_operands_matmul(backend::Context& ctx, const Tensor& x, const Tensor& w, const float* bias, Tensor& y) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor w_parts = ctx.scratch_for_output(DType::BF16, {2 * n, k});
  dequantize_matrix_split_bf16(ctx, w, w_parts);
  Tensor x_parts = ctx.scratch_for_output(DType::BF16, {2 * m, k});
  split_rows_bf16(ctx, x, x_parts);
  Tensor halves = ctx.scratch_for_output(DType::F32, {2 * m, n});
  const auto* w_hi = static_cast<const uint16_t*>(w_parts.raw_data());
  lt_matmul(ctx, CUDA_R_16BF, x_parts.raw_data(), 2 * m, k, w_hi, n, nullptr, halves.data<float>());
  lt_matmul(ctx, CUDA_R_16BF, x_parts.raw_data(), m, k, w_hi + n * k, n, nullptr, halves.data<float>(), true);
  add_split_halves(ctx, halves, bias, y);
}

}  // namespace

void linear(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  R3_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2, "linear (cuda): rank-2 tensors expected");
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  const bool quantized = w.dtype() == DType::F8_E4M3 || w.dtype() == DType::F4_E2M1X2;
  R3_CHECK(value_shape(w)[1] == k && y.dim(0) == m && y.dim(1) == n, "linear (cuda): x ", shape_to_string(x.shape()),
           " w ", shape_to_string(value_shape(w)), " y ", shape_to_string(y.shape()));
  R3_CHECK(x.dtype() == DType::F32 && (w.dtype() == DType::F32 || w.dtype() == DType::BF16 || quantized) &&
               y.dtype() == DType::F32,
           "linear (cuda): float32 activations and float32, bfloat16, FP8 or MXFP4 weights expected, got weights of ",
           dtype_name(w.dtype()));
  R3_CHECK(x.device() == Device::kCuda && w.device() == Device::kCuda && y.device() == Device::kCuda &&
               (bias == nullptr || bias->device() == Device::kCuda),
           "linear (cuda): tensors must be on the device");
  R3_CHECK(x.is_contiguous() && w.is_contiguous() && y.is_contiguous(), "linear (cuda): contiguous tensors expected");
  R3_CHECK(bias == nullptr || (bias->rank() == 1 && bias->dim(0) == n), "linear (cuda): bias shape");
  if (m == 0 || n == 0) return;
  const float* bp = bias != nullptr ? bias->data<float>() : nullptr;
  if (ctx.batch_invariant() || m <= kStreamingRowsBf16 || (w.dtype() == DType::F32 && m <= kStreamingRows)) {
    return linear_rows(ctx, x, w, bias, y);
  }
  if (quantized && m <= kMmaRows) {
    if (ctx.reduced_precision() && linear_mma_rows_fit(w)) return linear_mma_rows(ctx, x, w, bp, y);
    return linear_rows(ctx, x, w, bias, y);
  }
  if (quantized && ctx.reduced_precision()) {
    if (m <= kMmaRowsQuantized && linear_mma_rows_fit(w)) return linear_mma_rows(ctx, x, w, bp, y);
    return split_operands_matmul(ctx, x, w, bp, y);
  }
  if (quantized) {
    // Prefill-sized steps: the matrix decoded once into float32 scratch (the same floats the
    // weight-streaming kernel multiplies with) and multiplied on cuBLASLt in float32, so the
    // result keeps the CPU's accuracy; the scratch lasts for this call only.
    backend::Workspace::Scope scope(ctx.workspace());
    Tensor decoded = ctx.scratch_for_output(DType::F32, {n, k});
    dequantize_matrix(ctx, w, decoded);
    return lt_matmul(ctx, CUDA_R_32F, x.raw_data(), m, k, decoded.raw_data(), n, bp, y.data<float>());
  }
  if (m <= kMmaRows && linear_mma_rows_fit(w)) return linear_mma_rows(ctx, x, w, bp, y);
  if (w.dtype() == DType::F32) return lt_matmul(ctx, CUDA_R_32F, x.raw_data(), m, k, w.raw_data(), n, bp, y.data<float>());
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor parts = ctx.scratch_for_output(DType::BF16, {2 * m, k});
  Tensor halves = ctx.scratch_for_output(DType::F32, {2 * m, n});
  split_rows_bf16(ctx, x, parts);
  lt_matmul(ctx, CUDA_R_16BF, parts.raw_data(), 2 * m, k, w.raw_data(), n, nullptr, halves.data<float>());
  add_split_halves(ctx, halves, bp, y);
}

}  // namespace r3::ops::cuda
