// The fuzz targets' one piece of plumbing: r3 reads files by path (through the one file reader,
// io/input_file.h), so each input is written to a per-process temporary file first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace r3::fuzz {

// Writes data to a temporary file whose name ends in `suffix` (".json", ".safetensors": some
// readers pick the format by extension) and returns its path; the same path on every call.
const std::string& write_input(const uint8_t* data, std::size_t size, const std::string& suffix);

}  // namespace r3::fuzz
