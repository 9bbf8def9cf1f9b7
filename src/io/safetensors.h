// The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the raw bytes. Reading validates the whole header
// up front so that a truncated or malformed file is a clear error, never an out-of-bounds read.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"

namespace r3 {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the file; throws r3::Error with the path and the problem.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;

  // Zero-copy view of a tensor's bytes, in its stored dtype. Keeps the mapping alive.
  Tensor view(const std::string& name) const;

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file);
  void parse();

  std::shared_ptr<MappedFile> file_;
  const uint8_t* data_section_ = nullptr;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // any dtype, must be contiguous
};

// Writes a safetensors file (entries sorted by name, header padded to 8 bytes).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace r3
