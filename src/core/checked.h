// Checked size arithmetic: every size, offset and element count r3 computes from input it reads
// (checkpoint headers, configs, replay files, options) goes through these, so a hostile value
// is a clear error instead of a wrapped size, an out-of-bounds read or a runaway allocation.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/check.h"

namespace r3 {

// a * b, or an r3::Error naming `what` when the product does not fit in T.
template <typename T>
T checked_mul(T a, T b, const char* what) {
  static_assert(std::is_integral_v<T>);
  T out;
  R3_CHECK(!__builtin_mul_overflow(a, b, &out), what, ": ", a, " x ", b, " overflows");
  return out;
}

// a + b, or an r3::Error naming `what` when the sum does not fit in T.
template <typename T>
T checked_add(T a, T b, const char* what) {
  static_assert(std::is_integral_v<T>);
  T out;
  R3_CHECK(!__builtin_add_overflow(a, b, &out), what, ": ", a, " + ", b, " overflows");
  return out;
}

// `value` converted to T, or an r3::Error naming `what` when it is out of T's range.
template <typename T, typename U>
T checked_cast(U value, const char* what) {
  static_assert(std::is_integral_v<T> && std::is_integral_v<U>);
  R3_CHECK(std::in_range<T>(value), what, ": ", value, " is out of range [", std::numeric_limits<T>::min(), ", ",
           std::numeric_limits<T>::max(), "]");
  return static_cast<T>(value);
}

}  // namespace r3
