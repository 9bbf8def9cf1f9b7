// When a double sum of float terms does not depend on the order of its additions: every term 0
// or in [2^-21, 1], and at most 256 of them. Each such term is a multiple of 2^-44 (a float at
// or above 2^-21 has a unit in the last place of at least 2^-21 * 2^-23), so every partial sum
// is a multiple of 2^-44 no larger than 256 = 2^8: at most 52 significant bits, which a double
// holds exactly. No addition rounds, so any order (a warp's tree) gives the bits of the index
// order the CPU's softmax adds in. A softmax's exps after subtracting the max are at most 1;
// a row with an exp below 2^-21 (a spread of 14.6 or more between logits) takes the serial sum.
// Host and device: the routing kernels use it, and a CPU test checks the claim.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define R3_EXACT_SUM_HOST_DEVICE __host__ __device__
#else
#define R3_EXACT_SUM_HOST_DEVICE
#endif

namespace r3::moe {

// The most terms a sum may have for its order not to matter.
constexpr int64_t kExactSumMaxTerms = 256;
// The smallest nonzero term.
constexpr float kExactSumSmallest = 0x1p-21f;

// Whether v may be a term of an order-free sum.
R3_EXACT_SUM_HOST_DEVICE constexpr bool adds_exactly(float v) {
  return v == 0.0f || (v >= kExactSumSmallest && v <= 1.0f);
}

}  // namespace r3::moe

#undef R3_EXACT_SUM_HOST_DEVICE
