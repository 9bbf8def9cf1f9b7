// Weight matrices as r3's weight-streaming kernels read them, one row at a time: float32 or
// bfloat16 values, FP8 e4m3 values with a float32 scale per block of block_rows x block_cols
// (published FP8 checkpoints), or MXFP4 (two e2m1 values a byte, an e8m0 scale per 32 values of
// a row: GPT-OSS's experts). Quantized weights stay quantized in device memory; a kernel decodes
// each value in registers as it multiplies it, to the same float32 the CPU decodes
// (core/dtype.h): an FP8 value times its scale rounded once, an MXFP4 value times its power of two
// (exact). Only weight bytes change; activations and sums stay float32.
//
// A kernel takes a *matrix* (PlainMatrix<T>, Fp8Matrix, Mxfp4Matrix: pointers and sizes, passed
// by value) and asks it for rows (row_of), which the dot-product loop (warp_row_dots.cuh) reads
// either one value at a time (load) or eight at a time: load_raw8 issues the load, widen8 decodes
// it later, so that a lane's loads are all in flight before it waits for the first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cuda/weight_matrices.h"

namespace r3::ops::cuda {

// ---- Rows ----

template <typename T>
struct PlainRow {
  const T* values;
};
struct Fp8Row {
  const uint8_t* values;
  const float* scales;  // the row's scales, one per block_cols values
  int32_t block_cols;
  int32_t block_cols_shift;  // log2(block_cols) where the row is read eight values at a time
};
struct Mxfp4Row {
  const uint8_t* packed;
  const uint8_t* scales;  // one per 32 values
};

template <typename T>
__device__ inline PlainRow<T> row_of(const PlainMatrix<T>& m, int64_t r) {
  return {m.values + r * m.cols};
}
// By 32-bit divisions (a matrix holds fewer than 2^31 rows: fp8_matrix checks), as an expert's row
// is found after its kernel waits for the routing: the 64-bit ones are long software routines.
__device__ inline Fp8Row row_of(const Fp8Matrix& m, int64_t r) {
  const auto row = static_cast<uint32_t>(r), per_matrix = static_cast<uint32_t>(m.rows_per_matrix);
  const uint32_t matrix = row / per_matrix, inside = row - matrix * per_matrix;
  const uint32_t block_row = (static_cast<uint32_t>(m.first_row) + inside) / static_cast<uint32_t>(m.block_rows);
  const int64_t scale_row = static_cast<int64_t>(matrix) * m.scale_rows_per_matrix + block_row;
  return {m.values + r * m.cols, m.scales + scale_row * m.scale_cols, m.block_cols, m.block_cols_shift};
}
__device__ inline Mxfp4Row row_of(const Mxfp4Matrix& m, int64_t r) {
  return {m.packed + r * (m.cols / 2), m.scales + r * ((m.cols + 31) / 32)};
}

// ---- Decoding ----

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// Two e4m3 bytes (the lower first) as floats, exactly (every e4m3 value is a half).
__device__ inline float2 e4m3x2_to_float2(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return __half22float2(__half2(h));
}
__device__ inline float e4m3_to_float(uint8_t v) { return e4m3x2_to_float2(v).x; }

// An e2m1 nibble (1 sign, 2 exponent, 1 mantissa bit): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives.
__device__ inline float e2m1_to_float(uint32_t nibble) {
  const uint32_t e = (nibble >> 1) & 3u, m = nibble & 1u;
  const float magnitude = e == 0 ? 0.5f * static_cast<float>(m) : (1.0f + 0.5f * static_cast<float>(m)) * static_cast<float>(1u << (e - 1));
  return (nibble & 8u) ? -magnitude : magnitude;
}
// 2^(s - 127), exact for every s below 255 (the e8m0 NaN, refused at load): s = 0 is the
// float32 subnormal 2^-127.
__device__ inline float e8m0_to_float(uint8_t s) { return s == 0 ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(s) << 23); }

template <typename T>
__device__ inline float load(const PlainRow<T>& row, int64_t c) {
  return load(row.values, c);
}
// The scale of value c of an FP8 row, by a 32-bit division (a row is far shorter than 2^32; the
// 64-bit one is a long software routine).
__device__ inline float fp8_scale(const Fp8Row& row, int64_t c) {
  return row.scales[static_cast<uint32_t>(c) / static_cast<uint32_t>(row.block_cols)];
}
__device__ inline float load(const Fp8Row& row, int64_t c) {
  return __fmul_rn(e4m3_to_float(row.values[c]), fp8_scale(row, c));
}
__device__ inline float load(const Mxfp4Row& row, int64_t c) {
  const uint32_t nibble = (row.packed[c >> 1] >> ((c & 1) * 4)) & 0xFu;
  return __fmul_rn(e2m1_to_float(nibble), e8m0_to_float(row.scales[c >> 5]));
}

// ---- Eight values at a time ----

// Weights are streamed once per step, so their loads skip L1 (ld.global.nc.L1::no_allocate),
// leaving it to the activation rows that every warp of the SM re-reads.
__device__ inline uint4 load_streaming(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ inline uint2 load_streaming8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ inline uint32_t load_streaming4(const void* p) {
  uint32_t r;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}

// Eight consecutive weights as loaded, not yet decoded: 32 bytes of float32, 16 of bfloat16, 8 of
// e4m3, 4 of MXFP4. Raw loads keep a bfloat16 group at 4 registers.
template <typename Row>
struct Raw8;
template <>
struct Raw8<PlainRow<float>> {
  uint4 v[2];
};
template <>
struct Raw8<PlainRow<__nv_bfloat16>> {
  uint4 v;
};
template <>
struct Raw8<Fp8Row> {
  uint2 v;
};
template <>
struct Raw8<Mxfp4Row> {
  uint32_t v;
};

// Groups of eight weights a lane has in flight at once (warp_row_dots.cuh): a warp's loads are
// issued together and awaited once, rather than one round trip to memory per group (a decode step
// is a chain of such round trips otherwise). About 64 bytes of weights whatever their width (float32 keeps 4 groups, 128 bytes), so that narrower weights
// keep as many bytes on their way from memory.
template <typename Row>
constexpr int kGroupsInFlight = 4;
template <>
constexpr int kGroupsInFlight<Fp8Row> = 8;
template <>
constexpr int kGroupsInFlight<Mxfp4Row> = 16;

// Values [c, c + 8) of the row; c is a multiple of 8 and the row's start is aligned for the load
// (callers check: the kVec8 condition of each kernel).
__device__ inline void load_raw8(const PlainRow<float>& row, int64_t c, Raw8<PlainRow<float>>& r) {
  r.v[0] = load_streaming(row.values + c);
  r.v[1] = load_streaming(row.values + c + 4);
}
__device__ inline void load_raw8(const PlainRow<__nv_bfloat16>& row, int64_t c, Raw8<PlainRow<__nv_bfloat16>>& r) {
  r.v = load_streaming(row.values + c);
}
__device__ inline void load_raw8(const Fp8Row& row, int64_t c, Raw8<Fp8Row>& r) { r.v = load_streaming8(row.values + c); }
__device__ inline void load_raw8(const Mxfp4Row& row, int64_t c, Raw8<Mxfp4Row>& r) {
  r.v = load_streaming4(row.packed + c / 2);
}

__device__ inline void widen8(const PlainRow<float>&, int64_t, const Raw8<PlainRow<float>>& r, float* out) {
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __uint_as_float(reinterpret_cast<const uint32_t*>(r.v)[i]);
}
__device__ inline void widen8(const PlainRow<__nv_bfloat16>&, int64_t, const Raw8<PlainRow<__nv_bfloat16>>& r,
                              float* out) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&r.v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
// The eight values share one scale: block_cols is a power of two of at least 8 wherever kVec8 is
// chosen, so the scale's index is a shift. (The scale is not loaded with the values in
// load_raw8: the larger raw groups cost more than the load they would hide; measured slower:
// bench/RESULTS.md.)
// Eight e4m3 values times their block's scale.
__device__ inline void widen8_scaled(const Raw8<Fp8Row>& r, float scale, float* out) {
  const uint32_t words[2] = {r.v.x, r.v.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = e4m3x2_to_float2(static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2))));
    out[2 * i] = __fmul_rn(f.x, scale);
    out[2 * i + 1] = __fmul_rn(f.y, scale);
  }
}
__device__ inline void widen8(const Fp8Row& row, int64_t c, const Raw8<Fp8Row>& r, float* out) {
  widen8_scaled(r, row.scales[static_cast<uint32_t>(c) >> row.block_cols_shift], out);  // (kVec8: a power of two)
}
__device__ inline void widen8(const Mxfp4Row& row, int64_t c, const Raw8<Mxfp4Row>& r, float* out) {
  const float scale = e8m0_to_float(row.scales[c >> 5]);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __fmul_rn(e2m1_to_float((r.v >> (4 * i)) & 0xFu), scale);
}

}  // namespace r3::ops::cuda
