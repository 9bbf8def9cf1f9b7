#include "core/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace r3 {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::U8: return 1;
  }
  R3_FAIL("unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType d : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32,
                  DType::U16, DType::U8}) {
    if (dtype_name(d) == name) return d;
  }
  R3_FAIL("unsupported dtype '", name, "' (supported: F64, F32, BF16, F16, I64, I32, U16, U8)");
}

bool is_floating(DType dtype) {
  return dtype == DType::F64 || dtype == DType::F32 || dtype == DType::BF16 ||
         dtype == DType::F16;
}

float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t f32_to_bf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding = 0x7FFF + ((u >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1F;
  uint32_t mantissa = bits & 0x3FF;
  uint32_t out;
  if (exponent == 0x1F) {
    out = sign | 0x7F800000 | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;  // signed zero
  } else {
    // Subnormal half: value = mantissa * 2^-24, exact in float.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(out);
}

uint16_t f32_to_f16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7E00);
  if (magnitude >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to inf
  if (magnitude < 6.103515625e-05f) {
    // Subnormal range: quantise to multiples of 2^-24, ties to even (nearbyint).
    auto q = static_cast<uint16_t>(std::nearbyint(std::ldexp(magnitude, 24)));
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t bits = std::bit_cast<uint32_t>(magnitude);
  uint32_t exponent = ((bits >> 23) & 0xFF) - 112;
  uint32_t mantissa = bits & 0x7FFFFF;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into exponent
  return static_cast<uint16_t>(sign | half);
}

void convert_to_f32(const void* src, DType dtype, std::size_t count, float* dst) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  // memcpy per element: safetensors data need not be aligned for the element type.
  auto each = [&]<typename T>(T /*tag*/, auto&& to_float) {
    for (std::size_t i = 0; i < count; ++i) {
      T v;
      std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
      dst[i] = to_float(v);
    }
  };
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, count * sizeof(float)); return;
    case DType::F64: each(double{}, [](double v) { return static_cast<float>(v); }); return;
    case DType::BF16: each(uint16_t{}, bf16_to_f32); return;
    case DType::F16: each(uint16_t{}, f16_to_f32); return;
    case DType::I64: each(int64_t{}, [](int64_t v) { return static_cast<float>(v); }); return;
    case DType::I32: each(int32_t{}, [](int32_t v) { return static_cast<float>(v); }); return;
    case DType::U16: each(uint16_t{}, [](uint16_t v) { return static_cast<float>(v); }); return;
    case DType::U8: each(uint8_t{}, [](uint8_t v) { return static_cast<float>(v); }); return;
  }
}

}  // namespace r3
