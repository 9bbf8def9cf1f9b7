// This process's host memory as the kernel counts it (/proc/self/status): what is resident now
// (VmRSS: anonymous memory and the pages of mapped files it has touched) and the most it has been
// (VmHWM). Read after a model is placed on a device, it shows whether a second host copy of the
// weights stayed behind.
#pragma once

#include <cstdint>

namespace r3 {

struct ProcessMemory {
  int64_t resident_bytes = 0;
  int64_t peak_resident_bytes = 0;
};

// Throws r3::Error when /proc/self/status cannot be read or lacks the two lines.
ProcessMemory process_memory();

}  // namespace r3
