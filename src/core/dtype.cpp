#include "core/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace r3 {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::U8: case DType::F8_E4M3: case DType::F4_E2M1X2: return 1;
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
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F4_E2M1X2: return "F4_E2M1X2";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType d : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32,
                  DType::U16, DType::U8, DType::F8_E4M3}) {
    if (dtype_name(d) == name) return d;
  }
  R3_FAIL("unsupported dtype '", name, "' (supported: F64, F32, BF16, F16, F8_E4M3, I64, I32, U16, U8)");
}

bool is_floating(DType dtype) {
  return dtype == DType::F64 || dtype == DType::F32 || dtype == DType::BF16 ||
         dtype == DType::F16 || dtype == DType::F8_E4M3 || dtype == DType::F4_E2M1X2;
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

float f8_e4m3_to_f32(uint8_t bits) {
  const bool negative = (bits & 0x80) != 0;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // (1 + m/8) * 2^(e-7)
  }
  return negative ? -magnitude : magnitude;
}

uint8_t f32_to_f8_e4m3(float value) {
  const auto sign = static_cast<uint8_t>(std::signbit(value) ? 0x80 : 0x00);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7F);
  if (magnitude < 0x1p-6f) {
    // Subnormal range: multiples of 2^-9, ties to even; 8 * 2^-9 is the smallest normal (code 8).
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(magnitude, 9))));
  }
  if (magnitude >= 480.0f) return static_cast<uint8_t>(sign | 0x7F);
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent, fraction in [0.5, 1)
  // (1 + m/8) * 2^(exponent - 1): m = (2 * fraction - 1) * 8, exact in float, rounded to nearest even.
  auto mantissa = static_cast<int>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));
  int biased = exponent - 1 + 7;
  if (mantissa == 8) {
    mantissa = 0;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mantissa == 7)) return static_cast<uint8_t>(sign | 0x7F);
  return static_cast<uint8_t>(sign | (biased << 3) | mantissa);
}

const float* f8_e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[static_cast<std::size_t>(b)] = f8_e4m3_to_f32(static_cast<uint8_t>(b));
    return t;
  }();
  return table.data();
}

float f4_e2m1_to_f32(uint8_t nibble) { return f4_e2m1_table()[nibble & 0xF]; }

const float* f4_e2m1_table() {
  // Sign, then (exponent, mantissa): exponent 0 is the subnormal m * 0.5, exponent e > 0 is
  // (1 + m/2) * 2^(e-1).
  static constexpr std::array<float, 16> table = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return table.data();
}

float e8m0_to_f32(uint8_t bits) { return e8m0_table()[bits]; }

const float* e8m0_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 255; ++b) t[static_cast<std::size_t>(b)] = std::ldexp(1.0f, b - 127);  // exact, 2^-127 too
    t[255] = std::numeric_limits<float>::quiet_NaN();
    return t;
  }();
  return table.data();
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
    case DType::F8_E4M3: each(uint8_t{}, f8_e4m3_to_f32); return;
    case DType::F4_E2M1X2: R3_FAIL("F4_E2M1X2 values need their MXFP4 scales (row_to_f32 widens such a matrix)");
  }
}

}  // namespace r3
