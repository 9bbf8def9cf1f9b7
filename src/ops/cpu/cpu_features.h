// What the CPU offers the vectorised kernels, detected once.
#pragma once

namespace r3::ops {

// True when the CPU has AVX-512 F, BW and VL (the vectorised kernels need all three).
bool cpu_has_avx512();

}  // namespace r3::ops
