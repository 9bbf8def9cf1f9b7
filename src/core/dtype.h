// Element types r3 stores and the conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace r3 {

// F8_E4M3 is OCP e4m3fn ("float8_e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
// infinities, S.1111.111 the only NaN, subnormals m/8 * 2^-6. Published FP8 checkpoints store their
// weights in it with a float scale per block (Tensor::block_scales()); on its own it holds the
// unscaled values.
//
// F4_E2M1X2 is one byte holding two OCP e2m1 values (torch's "float4_e2m1fn_x2"): value 2i of a
// row in the low nibble of byte i, value 2i + 1 in the high nibble, as GPT-OSS's MXFP4 checkpoints
// pack them. A tensor of it has a shape in bytes ([rows, cols / 2] for a [rows, cols] matrix), so
// sizes, strides and row views work as for any one-byte type; value_shape() (core/tensor.h) is the
// shape of the values. r3 makes it from the checkpoint's U8 `*_blocks` with their e8m0 scales
// attached (Tensor::mx_scales()); safetensors files never name it.
enum class DType : uint8_t { F64, F32, BF16, F16, I64, I32, U16, U8, F8_E4M3, F4_E2M1X2 };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype string; throws r3::Error naming unsupported types.
DType dtype_from_name(std::string_view name);
bool is_floating(DType dtype);

// IEEE binary16 / bfloat16 <-> binary32. Narrowing rounds to nearest even; NaN stays NaN.
float bf16_to_f32(uint16_t bits);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);
uint16_t f32_to_f16(float value);

// e4m3fn <-> binary32. Decoding is exact. Encoding rounds to nearest even as
// torch's `.to(torch.float8_e4m3fn)` does: no saturation, so magnitudes that round beyond 448
// (from 464 up, 464 itself rounds to 448) and NaN give NaN (0x7F with the sign).
float f8_e4m3_to_f32(uint8_t bits);
uint8_t f32_to_f8_e4m3(float value);
// The 256 decoded values, indexed by the byte (for kernels).
const float* f8_e4m3_table();

// OCP e2m1 (one nibble: 1 sign, 2 exponent, 1 mantissa bit): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and, with
// bit 3 set, their negatives (-0 included); no infinities or NaN. Decoding is exact. The 16 values
// in nibble order are the table transformers' MXFP4 dequantization uses (FP4_VALUES).
float f4_e2m1_to_f32(uint8_t nibble);  // the low 4 bits
const float* f4_e2m1_table();
// OCP e8m0 (an MX scale): the power of two 2^(bits - 127), from 2^-127 (a float32 subnormal) to
// 2^127; 255 is NaN.
float e8m0_to_f32(uint8_t bits);
// The 256 decoded values, indexed by the byte (for kernels).
const float* e8m0_table();

// Converts `count` elements of `dtype` at `src` to float. Integer types convert exactly where
// float can hold them. F8_E4M3 converts its stored (unscaled) values: a block-scaled weight also
// needs its scales (see row_to_f32 in core/tensor.h). F4_E2M1X2 is refused: its values are nothing
// without their MXFP4 scales, and a byte holds two of them (row_to_f32 widens such a matrix).
void convert_to_f32(const void* src, DType dtype, std::size_t count, float* dst);

}  // namespace r3
