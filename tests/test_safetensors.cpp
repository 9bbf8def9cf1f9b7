// safetensors reading and writing: round trips, and every kind of damaged file is a clear
// r3::Error (never a crash or an out-of-bounds read; the sanitizer build checks the latter).
#include <gtest/gtest.h>

#include <fstream>

#include "io/safetensors.h"
#include "test_support.h"

namespace r3::test {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(),
                                                              static_cast<std::streamsize>(bytes.size()));
}

// A file with an arbitrary header text and `data_bytes` zero bytes of data.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header;
  bytes.append(data_bytes, '\0');
  write_bytes(path, bytes);
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripKeepsNamesShapesDtypesValuesAndMetadata) {
  TempDir tmp;
  const std::string path = tmp.path("t.safetensors");
  write_safetensors(path,
                    {{"b", Tensor::from<float>({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f}, {2, 3})},
                     {"a", Tensor::from<int32_t>({7, -9}, {2})},
                     {"empty", Tensor::from<float>({}, {0, 4})}},
                    {{"moe_layers", "0,1,2"}});
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->entries().size(), 3u);
  EXPECT_EQ(f->metadata().at("moe_layers"), "0,1,2");
  EXPECT_EQ(f->find("b")->shape, Shape({2, 3}));
  EXPECT_EQ(f->find("a")->dtype, DType::I32);
  EXPECT_EQ(read_as_f64(*f, "b"), (std::vector<double>{1.5, -2.0, 3.25, 0.0, 7.0, -1.0}));
  EXPECT_EQ(read_as_i64(*f, "a"), (std::vector<int64_t>{7, -9}));
  EXPECT_EQ(f->find("empty")->shape, Shape({0, 4}));
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_THROW(f->view("missing"), Error);
}

TEST(Safetensors, EveryTruncationIsAClearError) {
  TempDir tmp;
  const std::string good = tmp.path("good.safetensors");
  write_safetensors(good, {{"w", Tensor::from<float>({1, 2, 3, 4}, {2, 2})}});
  const std::string bytes = read_bytes(good);
  const std::string cut = tmp.path("cut.safetensors");
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(cut, bytes.substr(0, len));
    const std::string err = open_error(cut);
    EXPECT_FALSE(err.empty()) << "truncated to " << len << " bytes was accepted";
    EXPECT_NE(err.find(cut), std::string::npos) << "error does not name the file: " << err;
  }
}

TEST(Safetensors, MalformedHeadersAreClearErrors) {
  TempDir tmp;
  const std::string p = tmp.path("bad.safetensors");
  struct Bad {
    std::string header;
    std::size_t data;
    std::string expected;
  };
  const std::vector<Bad> cases = {
      {"{not json", 0, "malformed JSON"},
      {"[1, 2]", 0, "not a JSON object"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8, "needs 8"},
      {R"({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}})", 4, "unsupported dtype 'Q4'"},
      {R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "negative"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4, "end before begin"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8, "truncated"},
      {R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, "missing string 'dtype'"},
      {R"({"w": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12, "overlap"},
      {R"({"__metadata__": {"k": 3}})", 0, "not a string"},
  };
  for (const Bad& bad : cases) {
    write_raw(p, bad.header, bad.data);
    const std::string err = open_error(p);
    EXPECT_NE(err.find(bad.expected), std::string::npos)
        << "header " << bad.header << " gave: '" << err << "'";
  }
  // A header length beyond the file.
  write_bytes(p, std::string("\xff\xff\xff\x00\x00\x00\x00\x00{}", 10));
  EXPECT_NE(open_error(p).find("truncated"), std::string::npos);
  EXPECT_NE(open_error(tmp.path("absent.safetensors"))
                .find("cannot read " + tmp.path("absent.safetensors") + ": No such file or directory"),
            std::string::npos);
}

}  // namespace
}  // namespace r3::test
