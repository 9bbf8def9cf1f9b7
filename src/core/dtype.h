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
enum class DType : uint8_t { F64, F32, BF16, F16, I64, I32, U16, U8, F8_E4M3 };

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

// Converts `count` elements of `dtype` at `src` to float. Integer types convert exactly where
// float can hold them. F8_E4M3 converts its stored (unscaled) values: a block-scaled weight also
// needs its scales (see row_to_f32 in core/tensor.h).
void convert_to_f32(const void* src, DType dtype, std::size_t count, float* dst);

}  // namespace r3
