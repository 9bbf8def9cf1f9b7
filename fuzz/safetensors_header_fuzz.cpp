// libFuzzer target: a safetensors file (header length, JSON header, data) is parsed and every
// tensor it accepts is read in full. Any input must give an r3::Error or a file whose tensors are
// all inside the mapping; a crash, a sanitizer report or a hang is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char tmpl[] = "/tmp/r3-fuzz-safetensors-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd < 0) std::abort();
    ::close(fd);
    return std::string(tmpl);
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
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
