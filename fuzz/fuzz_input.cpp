#include "fuzz_input.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>

namespace r3::fuzz {

const std::string& write_input(const uint8_t* data, std::size_t size, const std::string& suffix) {
  static std::map<std::string, std::string> paths;  // one file per suffix, made once
  auto it = paths.find(suffix);
  if (it == paths.end()) {
    std::string name = "/tmp/r3-fuzz-XXXXXX" + suffix;
    const int fd = ::mkstemps(name.data(), static_cast<int>(suffix.size()));
    if (fd < 0) std::abort();
    ::close(fd);
    it = paths.emplace(suffix, name).first;
  }
  std::FILE* f = std::fopen(it->second.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return it->second;
}

}  // namespace r3::fuzz
