#include "io/process_memory.h"

#include <fstream>
#include <string>

#include "core/check.h"

namespace r3 {

ProcessMemory process_memory() {
  std::ifstream status("/proc/self/status");
  R3_CHECK(status.good(), "process memory: cannot read /proc/self/status");
  ProcessMemory m;
  bool resident = false, peak = false;
  // Lines such as "VmRSS:\t  123456 kB".
  for (std::string line; std::getline(status, line);) {
    const auto kib = [&](const char* key) { return std::stoll(line.substr(std::string(key).size())) * 1024; };
    if (line.rfind("VmRSS:", 0) == 0) {
      m.resident_bytes = kib("VmRSS:");
      resident = true;
    } else if (line.rfind("VmHWM:", 0) == 0) {
      m.peak_resident_bytes = kib("VmHWM:");
      peak = true;
    }
  }
  R3_CHECK(resident && peak, "process memory: /proc/self/status has no VmRSS or VmHWM line");
  return m;
}

}  // namespace r3
