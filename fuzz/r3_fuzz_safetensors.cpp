// libFuzzer target: a safetensors file (header length, JSON header, data) is parsed and every
// tensor it accepts is read in full, so an accepted entry outside the mapping is an ASan report.
#include <cstdint>

#include "core/check.h"
#include "fuzz_input.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = r3::fuzz::write_input(data, size, ".safetensors");
  try {
    auto file = r3::SafetensorsFile::open(path);
    unsigned sum = 0;
    for (const auto& [name, e] : file->entries()) {
      const r3::Tensor t = file->view(name);
      const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
      for (std::size_t i = 0; i < t.nbytes(); ++i) sum += bytes[i];
    }
    (void)sum;
  } catch (const r3::Error&) {
  }
  return 0;
}
