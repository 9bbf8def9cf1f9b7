// Element types r3 stores and the conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace r3 {

enum class DType : uint8_t { F64, F32, BF16, F16, I64, I32, U16, U8 };

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

// Converts `count` elements of `dtype` at `src` to float. Integer types convert exactly where
// float can hold them.
void convert_to_f32(const void* src, DType dtype, std::size_t count, float* dst);

}  // namespace r3
