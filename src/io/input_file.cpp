#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace r3 {

InputFile::InputFile(const std::string& path, uint64_t max_bytes, const char* what) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  R3_CHECK(fd_ >= 0, "cannot read ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    R3_FAIL("cannot read ", path, ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > max_bytes) {
    ::close(fd_);
    R3_FAIL("cannot read ", path, ": ", size_, " bytes, more than the ", max_bytes, " allowed for ", what);
  }
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::read_all() const {
  std::string out(static_cast<std::size_t>(size_), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    R3_CHECK(n >= 0, "cannot read ", path_, ": ", std::strerror(errno));
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return out;
}

std::string read_input_file(const std::string& path, uint64_t max_bytes, const char* what) {
  return InputFile(path, max_bytes, what).read_all();
}

std::string brief(const std::string& text, std::size_t max_chars) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

}  // namespace r3
