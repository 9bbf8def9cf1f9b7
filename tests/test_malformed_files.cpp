// Malformed files at the library level: the JSON reader's depth limit, safetensors headers whose
// sizes overflow, leave gaps or repeat a name, and tensor shapes that overflow. The same classes
// through the CLI, with exact messages, are the malformed-input suite (tests/malformed).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>

#include "core/tensor.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "test_support.h"

namespace r3::test {
namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(text.data(), static_cast<std::streamsize>(text.size()));
}

std::string malformed_read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string le64(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return bytes;
}

// A safetensors file with an arbitrary header text and `data_bytes` zero bytes of data.
void malformed_write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  write_text(path, le64(header.size()) + header + std::string(data_bytes, '\0'));
}

// 500k levels of '[': deep enough to overflow the stack of a recursive copy or print of the value.
std::string deeply_nested(std::size_t levels = 500'000) { return std::string(levels, '['); }

// ---- JSON: nesting depth, and messages that never print a whole value ----

TEST(MalformedJson, DeepNestingIsRefusedAtParseTime) {
  TempDir tmp;
  const std::string path = tmp.path("deep.json");
  write_text(path, deeply_nested());
  EXPECT_EQ(error_of([&] { read_json_file(path); }), path + ": JSON nested deeper than 64 levels");
  // 64 levels are fine, 65 are not.
  write_text(path, std::string(64, '[') + std::string(64, ']'));
  EXPECT_EQ(error_of([&] { read_json_file(path); }), "");
  write_text(path, std::string(65, '[') + std::string(65, ']'));
  EXPECT_EQ(error_of([&] { read_json_file(path); }), path + ": JSON nested deeper than 64 levels");
}

// ---- safetensors: sizes, tiling of the data section, duplicate names ----

TEST(MalformedSafetensors, EightByteElementCountThatWrapsIsRefused) {
  TempDir tmp;
  // [2^59, 4] I64 "needed" 2^61 * 8 = 2^64 = 0 bytes.
  malformed_write_raw(tmp.path("t.safetensors"),
            R"({"x":{"dtype":"I64","shape":[576460752303423488,4],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(tmp.path("t.safetensors")); }),
            tmp.path("t.safetensors") + ": tensor 'x': shape [576460752303423488, 4] of I64 is too large");
  // F64 too, and a zero dimension does not hide a huge one.
  malformed_write_raw(tmp.path("t.safetensors"),
            R"({"x":{"dtype":"F64","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(tmp.path("t.safetensors")); })
                .find(": tensor 'x': shape dimension 18446744073709551615 is out of range"),
            std::string::npos);
}

TEST(MalformedSafetensors, HeaderLengthOneByteShortIsRefused) {
  TempDir tmp;
  std::string bytes = malformed_read_bytes(family_dir("qwen3_moe") + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  const std::string path = tmp.path("model.safetensors");
  write_text(path, le64(n - 1) + bytes.substr(8));
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(path); }),
            path + ": data section is " + std::to_string(bytes.size() - 8 - n + 1) + " bytes but the tensors cover " +
                std::to_string(bytes.size() - 8 - n) + " (is the header length right?)");
}

TEST(MalformedSafetensors, GapsAndTrailingBytesAreRefused) {
  TempDir tmp;
  const std::string p = tmp.path("t.safetensors");
  malformed_write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            12);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }),
            p + ": bytes [4, 8) of the data section belong to no tensor (before tensor 'b')");
  malformed_write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }),
            p + ": bytes [0, 4) of the data section belong to no tensor (before tensor 'a')");
  malformed_write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), p + ": data section is 8 bytes but the tensors cover 4 (is the header length right?)");
  // Overlaps stay refused; empty tensors may sit anywhere in the tiling.
  malformed_write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), p + ": tensors 'a' and 'b' overlap");
  malformed_write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            4);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), "");
}

TEST(MalformedSafetensors, DuplicateTensorNamesAreRefused) {
  TempDir tmp;
  const std::string p = tmp.path("t.safetensors");
  malformed_write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), p + ": header: duplicate key 'a'");
}

TEST(MalformedSafetensors, ErrorsAreOneLineWhateverTheNames) {
  TempDir tmp;
  const std::string p = tmp.path("t.safetensors");
  malformed_write_raw(p, "{\"bad\\nname\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  const std::string err = error_of([&] { SafetensorsFile::open(p); });
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(err.find("tensor 'bad\\nname'"), std::string::npos) << err;
}

TEST(MalformedTensor, EmptyRefusesNegativeAndOverflowingShapes) {
  EXPECT_NE(error_of([] { Tensor::empty(DType::F64, {int64_t{1} << 59, 4}); }).find("overflows"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty(DType::F32, {int64_t{1} << 40, int64_t{1} << 40}); }).find("overflows"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty(DType::F32, {-1, -4}); }).find("negative dimension"), std::string::npos);
  EXPECT_NE(error_of([] { shape_numel({-1, -4}); }).find("negative dimension"), std::string::npos);
}

// ---- opening files: regular files only, size limits, shards inside the model folder ----

}  // namespace
}  // namespace r3::test
