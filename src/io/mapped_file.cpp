#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "io/input_file.h"

namespace r3 {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older kernels answer EINVAL and we touch the pages instead
#endif

void prefetch(const void* data, std::size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(data) + bytes;
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) return;
  // One read per page faults it in; the sum keeps the reads from being optimised away.
  const volatile unsigned char* p = static_cast<const unsigned char*>(data);
  unsigned char sink = 0;
  for (std::size_t i = 0; i < bytes; i += page) sink = static_cast<unsigned char>(sink + p[i]);
  (void)sink;
}

std::size_t release_pages(const void* data, std::size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + page - 1) & ~(page - 1), end = (start + bytes) & ~(page - 1);
  if (end <= begin) return 0;
  R3_CHECK(::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0,
           "release_pages: madvise failed: ", std::strerror(errno));
  return end - begin;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const InputFile file(path, kNoSizeLimit, "a mapped file");  // regular files only, without blocking
  size_ = static_cast<std::size_t>(file.size());
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    R3_CHECK(p != MAP_FAILED, "cannot map ", path, ": ", std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace r3
