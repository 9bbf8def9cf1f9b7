// The one place r3 opens a file it reads: a regular file only (a FIFO, a device or a folder is
// refused without blocking in open()), within a size limit for the kind of file, with errors
// that name the path and say why in one line.
#pragma once

#include <cstdint>
#include <string>

namespace r3 {

// Size limits for files read whole into memory (checkpoint shards are mapped, not read: no limit).
inline constexpr uint64_t kMaxConfigBytes = uint64_t{4} << 20;        // config.json
inline constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;       // model.safetensors.index.json
inline constexpr uint64_t kMaxReplayJsonBytes = uint64_t{256} << 20;  // --replay JSON
inline constexpr uint64_t kMaxLoadBytes = uint64_t{64} << 20;         // eplb-plan --load
inline constexpr uint64_t kMaxPromptsBytes = uint64_t{256} << 20;     // generate --ids-file
inline constexpr uint64_t kNoSizeLimit = UINT64_MAX;

// An open, readable regular file (RAII). Throws r3::Error:
//   "cannot read PATH: <strerror>"             (missing, permission, symlink loop, ...)
//   "cannot read PATH: not a regular file"     (a folder, a FIFO, a device, a socket)
//   "cannot read PATH: N bytes, more than the M allowed for WHAT"
class InputFile {
 public:
  InputFile(const std::string& path, uint64_t max_bytes, const char* what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The whole file (its size when opened).
  std::string read_all() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// InputFile(path, max_bytes, what).read_all().
std::string read_input_file(const std::string& path, uint64_t max_bytes, const char* what);

// Up to `max_chars` characters of `text` for a message, with control characters escaped and
// "..." when cut: names and values from a file never flood or break the one-line error.
std::string brief(const std::string& text, std::size_t max_chars = 120);

}  // namespace r3
