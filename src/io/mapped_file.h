// Read-only memory mapping of a whole file (RAII). Checkpoint tensors are views into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace r3 {

// Reads the pages of [data, data + bytes) of a mapping into memory now (so later accesses do not
// fault on them), without copying: the pages count once, as the file's.
void prefetch(const void* data, std::size_t bytes);

// Drops this process's resident pages of [data, data + bytes) of a read-only file mapping: the
// whole pages inside the range (a page it shares with a neighbour stays). Nothing is lost: a page
// touched again is read back from the file. Returns the bytes released.
std::size_t release_pages(const void* data, std::size_t bytes);

class MappedFile {
 public:
  // Throws r3::Error naming the path when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace r3
