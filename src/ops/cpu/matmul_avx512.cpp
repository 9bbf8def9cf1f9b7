// AVX-512 variant of matmul_rows (see ops/matmul.h for the arithmetic it must reproduce).
//
// One zmm register is the 16 lanes of one output element. A micro-tile of MR x rows by NR weight
// rows keeps MR * NR accumulators in registers: each 16-wide step loads NR weight vectors
// (widened from bf16/f16 in registers) and MR x vectors and issues MR * NR FMAs, so a weight
// element is read from memory once per MR rows. Weight rows are taken in panels that stay in L1
// while all x rows stream past. The K tail uses masked loads, which read zeros: the zero padding
// of the contract.
// GCC 12's AVX-512 headers build some results from _mm512_undefined_*() placeholders, which its
// flow analysis reports as uninitialised once inlined; the values are fully overwritten.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "ops/cpu/avx512_target.h"
#include "ops/cpu/matmul_kernels.h"

namespace r3::ops {

namespace {

template <DType D> struct WeightLoad;

template <> struct WeightLoad<DType::F32> {
  using T = float;
  R3_AVX512 static __m512 full(const T* p) { return _mm512_loadu_ps(p); }
  R3_AVX512 static __m512 masked(const T* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

template <> struct WeightLoad<DType::BF16> {
  using T = uint16_t;
  // bf16 is the top half of a float32: zero-extend to 32 bits and shift into place (exact).
  R3_AVX512 static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  R3_AVX512 static __m512 full(const T* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  R3_AVX512 static __m512 masked(const T* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

template <> struct WeightLoad<DType::F16> {
  using T = uint16_t;
  R3_AVX512 static __m512 full(const T* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  R3_AVX512 static __m512 masked(const T* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

// The next tile's NR weight rows at offset c into L2 (see micro_tile's `next`).
template <int NR, typename T>
R3_AVX512 inline void prefetch_rows(const T* next, int64_t k, int64_t c) {
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(next + j * k + c), _MM_HINT_T1);
}

// acc[i][j] = +0 for a tile's start.
template <int MR, int NR>
R3_AVX512 inline void zero_tile(__m512 (&acc)[MR][NR]) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
}

// acc[i][j] += x row i's 16 floats from c (all lanes) times wv[j].
template <int MR, int NR>
R3_AVX512 inline void fma_rows_full(__m512 (&acc)[MR][NR], const __m512 (&wv)[NR], const float* x, int64_t ldx,
                                    int64_t c) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    __m512 xv = _mm512_loadu_ps(x + i * ldx + c);
    // Keeps xv in a register: left alone, GCC folds the load into each of the NR FMAs as a
    // memory operand, and the tile becomes bound by loads instead of FMAs. Same FMAs, same
    // order: the bits do not change.
    __asm__("" : "+v"(xv));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
  }
}

// acc[i][j] += x row i's 16 floats from c (the lanes outside `mask` read as +0) times wv[j].
template <int MR, int NR>
R3_AVX512 inline void fma_rows(__m512 (&acc)[MR][NR], const __m512 (&wv)[NR], const float* x, int64_t ldx, int64_t c,
                               __mmask16 mask) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + c);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
  }
}

// y[i][j] = acc[i][j]'s lanes added pairwise (the contract's order), + bias[j] when given.
template <int MR, int NR>
R3_AVX512 inline void store_tile(__m512 (&acc)[MR][NR], const float* bias, float* y, int64_t ldy) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const float v = reduce_lanes_pairwise(acc[i][j]);
      y[i * ldy + j] = bias ? v + bias[j] : v;
    }
  }
}

// `next`: the weight rows of the tile that follows (or nullptr). Interleaved rows are a poor
// pattern for the hardware prefetchers, so each step also prefetches the next tile's rows at the
// same offset: they arrive while this tile computes. Into L2, not L1: fetched into L1 they evict
// the x rows and the panel being reused (measured: docs/performance.md).
template <DType D, int MR, int NR>
R3_AVX512 void micro_tile(const float* x, int64_t ldx, const typename WeightLoad<D>::T* w, int64_t k,
                          const float* bias, float* y, int64_t ldy, const typename WeightLoad<D>::T* next) {
  using L = WeightLoad<D>;
  constexpr int64_t kLine = 64 / sizeof(typename L::T);  // elements per cache line
  __m512 acc[MR][NR];
  zero_tile(acc);
  int64_t c = 0;
  for (; c + kMatmulLanes <= k; c += kMatmulLanes) {
    if (next != nullptr && c % kLine == 0) prefetch_rows<NR>(next, k, c);
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = L::full(w + j * k + c);
    fma_rows_full(acc, wv, x, ldx, c);
  }
  if (c < k) {
    const auto mask = static_cast<__mmask16>((1u << (k - c)) - 1u);
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = L::masked(w + j * k + c, mask);
    fma_rows(acc, wv, x, ldx, c, mask);
  }
  store_tile(acc, bias, y, ldy);
}

constexpr int kTileRows = 4;     // MR: x rows per micro-tile
constexpr int kTileWeights = 4;  // NR: weight rows per micro-tile
// A single x row (batch-1 decode) streams the weights one row after another: one sequential
// stream, which the hardware prefetchers follow, and nothing to reuse a weight vector for. From
// 2 rows on (the experts of a batched decode step get 1 to 4 tokens each at batch 16) the tiles
// pay: each x vector is loaded once for NR weight rows, where one row at a time needs MR + 1
// loads per MR FMAs and is bound by loads even from cache; with the next tile prefetched into L2
// they also beat streaming from memory (docs/performance.md).
constexpr int64_t kStreamingRows = 1;

template <DType D>
using TileFn = void (*)(const float*, int64_t, const typename WeightLoad<D>::T*, int64_t, const float*, float*, int64_t,
                        const typename WeightLoad<D>::T*);

template <DType D, int MR, int... NRs>
constexpr auto tile_row(std::integer_sequence<int, NRs...>) {
  return std::array<TileFn<D>, sizeof...(NRs)>{&micro_tile<D, MR, NRs + 1>...};
}

template <DType D, int... MRs>
constexpr auto tile_table(std::integer_sequence<int, MRs...>) {
  return std::array<std::array<TileFn<D>, kTileWeights>, sizeof...(MRs)>{
      tile_row<D, MRs + 1>(std::make_integer_sequence<int, kTileWeights>())...};
}

// The tiles of x rows [0, m) by weight rows [n0, n1), panel by panel (kMatmulPanelRows weight
// rows stay in L1 while every x row streams past): fn(i0, mr, j0, nr, prefetch). `prefetch`: the
// tile is in the first row block and not the last of the range, so it brings the next weight rows
// (later row blocks find them cached).
template <typename F>
inline void for_each_tile(int64_t m, int64_t n0, int64_t n1, F&& fn) {
  for (int64_t p0 = n0; p0 < n1; p0 += kMatmulPanelRows) {
    const int64_t p1 = std::min(n1, p0 + kMatmulPanelRows);
    for (int64_t i0 = 0; i0 < m; i0 += kTileRows) {
      const int64_t mr = std::min<int64_t>(kTileRows, m - i0);
      for (int64_t j0 = p0; j0 < p1; j0 += kTileWeights) {
        fn(i0, mr, j0, std::min<int64_t>(kTileWeights, p1 - j0), i0 == 0 && j0 + kTileWeights < n1);
      }
    }
  }
}

template <DType D>
R3_AVX512 void run(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                   const float* bias, float* y, int64_t ldy) {
  static constexpr auto table = tile_table<D>(std::make_integer_sequence<int, kTileRows>());
  const auto* weights = static_cast<const typename WeightLoad<D>::T*>(w.data);
  const int64_t k = w.cols;
  if (m <= kStreamingRows) {
    for (int64_t j = n0; j < n1; ++j) {
      table[static_cast<std::size_t>(m - 1)][0](x, ldx, weights + j * k, k, bias ? bias + j : nullptr, y + (j - n0), ldy,
                                                nullptr);
    }
    return;
  }
  for_each_tile(m, n0, n1, [&](int64_t i0, int64_t mr, int64_t j0, int64_t nr, bool prefetch) {
    table[static_cast<std::size_t>(mr - 1)][static_cast<std::size_t>(nr - 1)](
        x + i0 * ldx, ldx, weights + j0 * k, k, bias ? bias + j0 : nullptr, y + i0 * ldy + (j0 - n0), ldy,
        prefetch ? weights + (j0 + kTileWeights) * k : nullptr);
  });
}

// F8_E4M3 weights with block scales. An e4m3 byte s.eeee.mmm written into an f16 as
// s.0eeee.mmm0000000 is the same number times 2^-8, subnormals included (e4m3's are m/8 * 2^-6,
// f16's m/8 * 2^-14), so the F16C conversion decodes it exactly; times 256 (exact) it is the e4m3
// value, and times the block's scale it is the weight, rounded once as matmul.h defines. The one
// e4m3 NaN (s.1111.111) would read as 480: it becomes an f16 NaN first. Each block column of the
// row keeps one broadcast scale, so the 16-lane steps must not straddle blocks: block_cols a
// multiple of 16 (published checkpoints use 128; others take the portable kernel).
//
// A weight whose BlockScales are `plain` (no NaN byte, every scale * 2^120 finite: published
// checkpoints) takes a shorter decode: e4m3 * 2^-120 straight from the bits, times scale * 2^120
// (computed once per block): the same real product, rounded once, so the same bits.
template <bool kPlain>
R3_AVX512 inline __m512 decode_f8(__m128i bytes) {
  if constexpr (kPlain) {
    // s.eeee.mmm as float32 bits s.0000eeee.mmm0...0 is e4m3 * 2^-120 (a float32 subnormal for
    // e = 0, exact while the MXCSR's denormals-are-zero is off: run_f8's caller checks): the sign
    // from the sign extension, the 7 magnitude bits shifted into place. The scale carries 2^120.
    const __m512i widened = _mm512_cvtepi8_epi32(bytes);  // sign-extended: bit 7 fills bits 8-31
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(widened, 20),
                                                 _mm512_set1_epi32(static_cast<int>(0x87F00000u))));
  }
  const __m256i widened = _mm256_cvtepi8_epi16(bytes);  // sign-extended: bit 7 fills bits 8-15
  __m256i half = _mm256_and_si256(_mm256_slli_epi16(widened, 7), _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  const __mmask16 nan =
      _mm256_cmpeq_epi16_mask(_mm256_and_si256(half, _mm256_set1_epi16(0x7FFF)), _mm256_set1_epi16(0x3F80));
  half = _mm256_mask_blend_epi16(nan, half, _mm256_set1_epi16(0x7E00));
  return _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
}

template <bool kPlain, int MR, int NR>
R3_AVX512 void micro_tile_f8(const float* x, int64_t ldx, const uint8_t* w, int64_t k, const float* const* scale_rows,
                             int64_t block_cols, const float* bias, float* y, int64_t ldy, const uint8_t* next) {
  constexpr int64_t kLine = 64;  // bytes per cache line
  __m512 acc[MR][NR];
  zero_tile(acc);
  for (int64_t c0 = 0; c0 < k; c0 += block_cols) {
    const int64_t c1 = std::min(k, c0 + block_cols);
    __m512 scale[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      scale[j] = _mm512_set1_ps(kPlain ? scale_rows[j][c0 / block_cols] * 0x1p120f : scale_rows[j][c0 / block_cols]);
    }
    int64_t c = c0;
    for (; c + kMatmulLanes <= c1; c += kMatmulLanes) {
      if (next != nullptr && c % kLine == 0) prefetch_rows<NR>(next, k, c);
      __m512 wv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        wv[j] = _mm512_mul_ps(decode_f8<kPlain>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * k + c))), scale[j]);
      }
      fma_rows_full(acc, wv, x, ldx, c);
    }
    if (c < c1) {  // the K tail (c1 == k): masked lanes are +0 in x and w, the zero padding
      const auto mask = static_cast<__mmask16>((1u << (c1 - c)) - 1u);
      __m512 wv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        wv[j] = _mm512_maskz_mul_ps(mask, decode_f8<kPlain>(_mm_maskz_loadu_epi8(mask, w + j * k + c)), scale[j]);
      }
      fma_rows(acc, wv, x, ldx, c, mask);
    }
  }
  store_tile(acc, bias, y, ldy);
}

using TileF8Fn = void (*)(const float*, int64_t, const uint8_t*, int64_t, const float* const*, int64_t, const float*,
                          float*, int64_t, const uint8_t*);

template <bool kPlain, int MR, int... NRs>
constexpr auto tile_row_f8(std::integer_sequence<int, NRs...>) {
  return std::array<TileF8Fn, sizeof...(NRs)>{&micro_tile_f8<kPlain, MR, NRs + 1>...};
}

template <bool kPlain, int... MRs>
constexpr auto tile_table_f8(std::integer_sequence<int, MRs...>) {
  return std::array<std::array<TileF8Fn, kTileWeights>, sizeof...(MRs)>{
      tile_row_f8<kPlain, MRs + 1>(std::make_integer_sequence<int, kTileWeights>())...};
}

// run<D>'s tiling, for F8_E4M3: each tile also gets its weight rows' scale rows.
template <bool kPlain>
R3_AVX512 void run_f8(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy) {
  static constexpr auto table = tile_table_f8<kPlain>(std::make_integer_sequence<int, kTileRows>());
  const auto* weights = static_cast<const uint8_t*>(w.data);
  const int64_t k = w.cols;
  // No one-row streaming here (unlike run<D>): with one byte per weight, a single row's chain of
  // dependent FMAs, not memory, bounds a batch-1 step; the 1 x 4 tiles run four chains at once.
  for_each_tile(m, n0, n1, [&](int64_t i0, int64_t mr, int64_t j0, int64_t nr, bool prefetch) {
    const float* scales[kTileWeights];
    for (int64_t j = 0; j < nr; ++j) scales[j] = w.scale_row(j0 + j);
    table[static_cast<std::size_t>(mr - 1)][static_cast<std::size_t>(nr - 1)](
        x + i0 * ldx, ldx, weights + j0 * k, k, scales, w.block_cols, bias ? bias + j0 : nullptr,
        y + i0 * ldy + (j0 - n0), ldy, prefetch ? weights + (j0 + kTileWeights) * k : nullptr);
  });
}

// MXFP4 weights (F4_E2M1X2 with e8m0 scales). A 32-value block of a row is 16 bytes and one
// scale. The 16 e2m1 values times the block's scale are one zmm table (each entry the single
// float32 product e2m1 * 2^(scale - 127) that matmul.h defines), and vpermps looks every nibble up
// in it, so the weights come out already scaled, with the bits of the widened float32 copy. The
// nibbles are spread one per byte first: byte i's high nibble is the low nibble of byte i of the
// bytes shifted right by 4 (vpermps reads only an index's low 4 bits, so neither the low nibbles
// nor the shifted bytes need masking), and interleaving the two gives values 0-15 and 16-31 in
// order (value 2i is byte i's low nibble, as transformers' convert_moe_packed_tensors reads it).
R3_AVX512 inline void decode_f4(__m128i bytes, __m512 table, __mmask16 lo_mask, __mmask16 hi_mask, __m512& lo,
                                __m512& hi) {
  const __m128i high_nibbles = _mm_srli_epi16(bytes, 4);
  lo = _mm512_maskz_permutexvar_ps(lo_mask, _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, high_nibbles)), table);
  hi = _mm512_maskz_permutexvar_ps(hi_mask, _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(bytes, high_nibbles)), table);
}

// NR weight rows at w (rows `stride` bytes apart, scales `scale_stride` apart), k values each. A
// last, partial block of n < 32 values loads only its n / 2 bytes and takes the 16-lane steps the
// contract has there (one, or a full one and a masked one); masked lanes are +0 in x and w.
template <int MR, int NR>
R3_AVX512 void micro_tile_f4(const float* x, int64_t ldx, const uint8_t* w, int64_t stride, const uint8_t* scales,
                             int64_t scale_stride, int64_t k, const float* bias, float* y, int64_t ldy,
                             const uint8_t* next) {
  constexpr int64_t kBlock = MxScales::kBlock;
  const __m512 values = _mm512_loadu_ps(f4_e2m1_table());
  const float* e8m0 = e8m0_table();
  __m512 acc[MR][NR];
  zero_tile(acc);
  for (int64_t c = 0; c < k; c += kBlock) {
    const int64_t byte = c / 2, n = std::min(kBlock, k - c);
    if (next != nullptr && byte % 64 == 0) prefetch_rows<NR>(next, stride, byte);
    __m512 lo[NR], hi[NR];
    if (n == kBlock) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const __m512 table = _mm512_mul_ps(values, _mm512_set1_ps(e8m0[scales[j * scale_stride + c / kBlock]]));
        decode_f4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * stride + byte)), table, 0xFFFF, 0xFFFF,
                  lo[j], hi[j]);
      }
      fma_rows_full(acc, lo, x, ldx, c);
      fma_rows_full(acc, hi, x, ldx, c + kMatmulLanes);
      continue;
    }
    const auto lo_mask = static_cast<__mmask16>(n >= kMatmulLanes ? 0xFFFFu : (1u << n) - 1u);
    const auto hi_mask = static_cast<__mmask16>(n > kMatmulLanes ? (1u << (n - kMatmulLanes)) - 1u : 0u);
    const auto byte_mask = static_cast<__mmask16>((1u << (n / 2)) - 1u);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m512 table = _mm512_mul_ps(values, _mm512_set1_ps(e8m0[scales[j * scale_stride + c / kBlock]]));
      decode_f4(_mm_maskz_loadu_epi8(byte_mask, w + j * stride + byte), table, lo_mask, hi_mask, lo[j], hi[j]);
    }
    fma_rows(acc, lo, x, ldx, c, lo_mask);
    if (hi_mask != 0) fma_rows(acc, hi, x, ldx, c + kMatmulLanes, hi_mask);
  }
  store_tile(acc, bias, y, ldy);
}

using TileF4Fn = void (*)(const float*, int64_t, const uint8_t*, int64_t, const uint8_t*, int64_t, int64_t,
                          const float*, float*, int64_t, const uint8_t*);

template <int MR, int... NRs>
constexpr auto tile_row_f4(std::integer_sequence<int, NRs...>) {
  return std::array<TileF4Fn, sizeof...(NRs)>{&micro_tile_f4<MR, NRs + 1>...};
}

template <int... MRs>
constexpr auto tile_table_f4(std::integer_sequence<int, MRs...>) {
  return std::array<std::array<TileF4Fn, kTileWeights>, sizeof...(MRs)>{
      tile_row_f4<MRs + 1>(std::make_integer_sequence<int, kTileWeights>())...};
}

// run_f8's tiling (tiles from one x row on: the decode, not memory, bounds a batch-1 step), for
// MXFP4: each tile gets its first weight row and scale row, and the strides between rows.
R3_AVX512 void run_f4(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy) {
  static constexpr auto table = tile_table_f4(std::make_integer_sequence<int, kTileRows>());
  for_each_tile(m, n0, n1, [&](int64_t i0, int64_t mr, int64_t j0, int64_t nr, bool prefetch) {
    table[static_cast<std::size_t>(mr - 1)][static_cast<std::size_t>(nr - 1)](
        x + i0 * ldx, ldx, w.packed_row(j0), w.row_stride, w.mx_scale_row(j0), w.scale_stride, w.cols,
        bias ? bias + j0 : nullptr, y + i0 * ldy + (j0 - n0), ldy, prefetch ? w.packed_row(j0 + kTileWeights) : nullptr);
  });
}

}  // namespace

void matmul_rows_avx512(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                        const float* bias, float* y, int64_t ldy) {
  switch (w.dtype) {
    case DType::BF16: return run<DType::BF16>(x, m, ldx, w, n0, n1, bias, y, ldy);
    case DType::F16: return run<DType::F16>(x, m, ldx, w, n0, n1, bias, y, ldy);
    case DType::F8_E4M3:
      if (w.block_cols % kMatmulLanes != 0) return matmul_rows_portable(x, m, ldx, w, n0, n1, bias, y, ldy);
      if (w.plain_scales && (_mm_getcsr() & 0x40u) == 0) return run_f8<true>(x, m, ldx, w, n0, n1, bias, y, ldy);
      return run_f8<false>(x, m, ldx, w, n0, n1, bias, y, ldy);
    case DType::F4_E2M1X2: return run_f4(x, m, ldx, w, n0, n1, bias, y, ldy);
    default: return run<DType::F32>(x, m, ldx, w, n0, n1, bias, y, ldy);
  }
}

}  // namespace r3::ops
