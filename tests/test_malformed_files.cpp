// Malformed files: deeply nested JSON, safetensors headers whose sizes overflow, leave gaps or
// repeat a name, files that are not regular files, shard paths that leave the model folder, and
// replay files with ids or shapes out of range. Each is one line `r3: error: ...` naming the file
// and the field, and a non-zero exit; never a crash, a hang or an out-of-bounds read.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/tensor.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "test_support.h"

namespace r3::test {
namespace {

namespace fs = std::filesystem;


void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(text.data(), static_cast<std::streamsize>(text.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string le64(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return bytes;
}

// A safetensors file with an arbitrary header text and `data_bytes` zero bytes of data.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  write_text(path, le64(header.size()) + header + std::string(data_bytes, '\0'));
}

// 500k levels of '[': overflowed the stack when the value was copied or printed.
std::string deeply_nested(std::size_t levels = 500'000) { return std::string(levels, '['); }

// `r3 ARGS` under a time limit (a FIFO blocked open() forever); exit code 124 when it ran out.
CommandResult run_r3_limited(const std::string& args) {
  TempDir tmp;
  const std::string out = tmp.path("out"), err = tmp.path("err");
  const std::string cmd =
      "timeout -k 5 30 " + r3_binary() + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

// The CLI refused the input with exit 1 and exactly one line `r3: error: ...` holding `needle`.
void expect_one_line_error(const CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("r3: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

// A copy of the qwen3_moe fixture (config.json and model.safetensors) in tmp.path(name).
std::string copy_fixture(const TempDir& tmp, const std::string& name = "model") {
  const std::string dir = tmp.path(name);
  fs::create_directories(dir);
  fs::copy_file(family_dir("qwen3_moe") + "/config.json", dir + "/config.json");
  fs::copy_file(family_dir("qwen3_moe") + "/model.safetensors", dir + "/model.safetensors");
  return dir;
}

const std::string kQwen = " --model " + family_dir("qwen3_moe") + " --ids 1,2,3";

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

TEST(MalformedJson, DeepNestingInAReplayFileIsOneLineError) {
  TempDir tmp;
  write_text(tmp.path("r.json"), "{\"routed_experts\": " + deeply_nested());
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + tmp.path("r.json")),
                        tmp.path("r.json") + ": JSON nested deeper than 64 levels");
}

TEST(MalformedJson, DeepNestingInAnEplbLoadFileIsOneLineError) {
  TempDir tmp;
  write_text(tmp.path("l.json"), "{\"load\": [[1, " + deeply_nested());
  expect_one_line_error(run_r3("eplb-plan --load " + tmp.path("l.json") + " --gpus 1"),
                        tmp.path("l.json") + ": JSON nested deeper than 64 levels");
}

TEST(MalformedJson, DeepNestingInTheCheckpointIndexIsOneLineError) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp);
  write_text(dir + "/model.safetensors.index.json", "{\"weight_map\": " + deeply_nested());
  expect_one_line_error(run_r3("forward -q --model " + dir + " --ids 1,2,3"),
                        dir + "/model.safetensors.index.json: JSON nested deeper than 64 levels");
}

TEST(MalformedJson, MessagesQuoteAtMostAShortPieceOfAValue) {
  TempDir tmp;
  // A load that is a long string (or a deep list, which dump() would print whole).
  write_text(tmp.path("l.json"), "[[1, \"" + std::string(100'000, 'x') + "\"]]");
  const CommandResult r = run_r3("eplb-plan --load " + tmp.path("l.json") + " --gpus 1");
  expect_one_line_error(r, tmp.path("l.json") + ": layer 0: load 1 (a string \"xxxxxxxx");
  EXPECT_LT(r.err.size(), 300u) << r.err;
  write_text(tmp.path("l.json"), "[[1, " + std::string(60, '[') + std::string(60, ']') + "]]");
  const CommandResult deep = run_r3("eplb-plan --load " + tmp.path("l.json") + " --gpus 1");
  expect_one_line_error(deep, tmp.path("l.json") + ": layer 0: load 1 (a list of 1 element");
  EXPECT_LT(deep.err.size(), 300u) << deep.err;
}

// ---- safetensors: sizes, tiling of the data section, duplicate names ----

TEST(MalformedSafetensors, EightByteElementCountThatWrapsIsRefused) {
  TempDir tmp;
  // [2^59, 4] I64 "needed" 2^61 * 8 = 2^64 = 0 bytes.
  write_raw(tmp.path("t.safetensors"),
            R"({"x":{"dtype":"I64","shape":[576460752303423488,4],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(tmp.path("t.safetensors")); }),
            tmp.path("t.safetensors") + ": tensor 'x': shape [576460752303423488, 4] of I64 is too large");
  // F64 too, and a zero dimension does not hide a huge one.
  write_raw(tmp.path("t.safetensors"),
            R"({"x":{"dtype":"F64","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(tmp.path("t.safetensors")); })
                .find(": tensor 'x': shape dimension 18446744073709551615 is out of range"),
            std::string::npos);
}

TEST(MalformedSafetensors, HeaderLengthOneByteShortIsRefused) {
  TempDir tmp;
  std::string bytes = read_bytes(family_dir("qwen3_moe") + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  const std::string dir = copy_fixture(tmp);
  write_text(dir + "/model.safetensors", le64(n - 1) + bytes.substr(8));
  const std::string err = error_of([&] { SafetensorsFile::open(dir + "/model.safetensors"); });
  EXPECT_NE(err.find(dir + "/model.safetensors: data section is " + std::to_string(bytes.size() - 8 - n + 1) +
                     " bytes but the tensors cover " + std::to_string(bytes.size() - 8 - n)),
            std::string::npos)
      << err;
  expect_one_line_error(run_r3("forward -q --model " + dir + " --ids 1,2,3"), "/model.safetensors: data section is");
}

TEST(MalformedSafetensors, GapsAndTrailingBytesAreRefused) {
  TempDir tmp;
  const std::string p = tmp.path("t.safetensors");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            12);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }),
            p + ": bytes [4, 8) of the data section belong to no tensor (before tensor 'b')");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }),
            p + ": bytes [0, 4) of the data section belong to no tensor (before tensor 'a')");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), p + ": data section is 8 bytes but the tensors cover 4 (is the header length right?)");
  // Overlaps stay refused; empty tensors may sit anywhere in the tiling.
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), p + ": tensors 'a' and 'b' overlap");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            4);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), "");
}

TEST(MalformedSafetensors, DuplicateTensorNamesAreRefused) {
  TempDir tmp;
  const std::string p = tmp.path("t.safetensors");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), p + ": header: duplicate key 'a'");
}

TEST(MalformedSafetensors, ErrorsAreOneLineWhateverTheNames) {
  TempDir tmp;
  const std::string p = tmp.path("t.safetensors");
  write_raw(p, "{\"bad\\nname\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
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

TEST(MalformedFiles, FifoAsReplayFileIsRefusedWithoutBlocking) {
  TempDir tmp;
  ASSERT_EQ(::mkfifo(tmp.path("r.json").c_str(), 0600), 0);
  expect_one_line_error(run_r3_limited("forward -q" + kQwen + " --replay " + tmp.path("r.json")),
                        "cannot read " + tmp.path("r.json") + ": not a regular file");
  ASSERT_EQ(::mkfifo(tmp.path("r.safetensors").c_str(), 0600), 0);
  expect_one_line_error(run_r3_limited("forward -q" + kQwen + " --replay " + tmp.path("r.safetensors")),
                        "cannot read " + tmp.path("r.safetensors") + ": not a regular file");
}

TEST(MalformedFiles, FifoAsCheckpointOrShardIsRefusedWithoutBlocking) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp);
  fs::remove(dir + "/model.safetensors");
  ASSERT_EQ(::mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  expect_one_line_error(run_r3_limited("forward -q --model " + dir + " --ids 1,2,3"),
                        "cannot read " + dir + "/model.safetensors: not a regular file");
  fs::remove(dir + "/model.safetensors");
  write_text(dir + "/model.safetensors.index.json", R"({"weight_map": {"lm_head.weight": "shard.safetensors"}})");
  ASSERT_EQ(::mkfifo((dir + "/shard.safetensors").c_str(), 0600), 0);
  expect_one_line_error(run_r3_limited("forward -q --model " + dir + " --ids 1,2,3"),
                        "cannot read " + dir + "/shard.safetensors: not a regular file");
  fs::remove(dir + "/model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((dir + "/model.safetensors.index.json").c_str(), 0600), 0);
  expect_one_line_error(run_r3_limited("forward -q --model " + dir + " --ids 1,2,3"),
                        "cannot read " + dir + "/model.safetensors.index.json: not a regular file");
}

TEST(MalformedFiles, DirectoryOrSymlinkLoopIsAClearError) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp);
  fs::remove(dir + "/model.safetensors");
  fs::create_symlink("model.safetensors", dir + "/model.safetensors");  // points at itself
  expect_one_line_error(run_r3("forward -q --model " + dir + " --ids 1,2,3"),
                        "cannot read " + dir + "/model.safetensors: Too many levels of symbolic links");
  fs::remove(dir + "/model.safetensors");
  fs::create_directory(dir + "/model.safetensors");
  expect_one_line_error(run_r3("forward -q --model " + dir + " --ids 1,2,3"),
                        "cannot read " + dir + "/model.safetensors: not a regular file");
  fs::create_directory(tmp.path("r.json"));
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + tmp.path("r.json")),
                        "cannot read " + tmp.path("r.json") + ": not a regular file");
  fs::create_symlink("loop.json", tmp.path("loop.json"));
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + tmp.path("loop.json")),
                        "cannot read " + tmp.path("loop.json") + ": Too many levels of symbolic links");
  expect_one_line_error(run_r3("eplb-plan --gpus 1 --load " + tmp.path("loop.json")),
                        "cannot read " + tmp.path("loop.json") + ": Too many levels of symbolic links");
}

TEST(MalformedFiles, OversizedJsonIsRefusedBeforeReading) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp);
  const std::string index = dir + "/model.safetensors.index.json";
  write_text(index, "{}");
  fs::resize_file(index, uint64_t{1} << 30);  // sparse: 1 GiB of zero bytes
  expect_one_line_error(run_r3("forward -q --model " + dir + " --ids 1,2,3"),
                        "cannot read " + index + ": 1073741824 bytes, more than the 67108864 allowed for a checkpoint index");
  write_text(tmp.path("r.json"), "[]");
  fs::resize_file(tmp.path("r.json"), uint64_t{1} << 32);
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + tmp.path("r.json")),
                        "cannot read " + tmp.path("r.json") + ": 4294967296 bytes, more than the 268435456 allowed for a replay file");
}

TEST(MalformedFiles, ShardPathsMustStayInsideTheModelFolder) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp);
  fs::copy_file(dir + "/model.safetensors", tmp.path("outside.safetensors"));
  fs::remove(dir + "/model.safetensors");
  const std::string index = dir + "/model.safetensors.index.json";
  for (const std::string& shard : std::vector<std::string>{"../outside.safetensors", tmp.path("outside.safetensors"),
                                  "sub/../../outside.safetensors", "/etc/passwd", ""}) {
    write_text(index, R"({"weight_map": {"lm_head.weight": ")" + shard + "\"}}");
    expect_one_line_error(run_r3("forward -q --model " + dir + " --ids 1,2,3"),
                          index + ": weight_map['lm_head.weight']: shard path '" + shard +
                              "' is not a file name inside the model folder");
  }
}

// ---- replay files: ids and shapes out of range ----

TEST(MalformedReplay, JsonIdsBeyond32BitsAreRefusedNotWrapped) {
  TempDir tmp;
  const std::string row = "[[0, 4294967297], [0, 1], [0, 1]]";
  write_text(tmp.path("r.json"), "[" + row + "," + row + "]");
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + tmp.path("r.json")),
                        tmp.path("r.json") + ": row 0 MoE layer 0: expert id 4294967297 outside [0, 8)");
  write_text(tmp.path("r.json"), "[[[0, 1e30], [0, 1], [0, 1]]]");
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + tmp.path("r.json")),
                        tmp.path("r.json") + ": row 0 MoE layer 0: a number 1e+30 is not an integer expert id");
}

TEST(MalformedReplay, SafetensorsIdsWithWrappingShapeAreRefused) {
  TempDir tmp;
  // [2^60, 1, 2] I64 = 2^61 elements, 2^64 bytes: wrapped to 0 bytes, then 2^61 ids were read.
  const std::string p = tmp.path("r.safetensors");
  write_raw(p, R"({"topk_ids":{"dtype":"I64","shape":[1152921504606846976,1,2],"data_offsets":[0,0]}})", 0);
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + p),
                        p + ": tensor 'topk_ids': shape [1152921504606846976, 1, 2] of I64 is too large");
  // Out-of-range I64 and I32 values name the row, layer and value.
  write_safetensors(p, {{"topk_ids", Tensor::from<int64_t>({0, 1, 0, 1, 0, int64_t{1} << 32}, {1, 3, 2})}});
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + p),
                        p + ": row 0 MoE layer 2: expert id 4294967296 outside [0, 8)");
  write_safetensors(p, {{"topk_ids", Tensor::from<int32_t>({0, 1, -3, 1, 0, 1}, {1, 3, 2})}});
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + p),
                        p + ": row 0 MoE layer 1: expert id -3 outside [0, 8)");
  // A layer count or top-k of the wrong size is named before any id is read.
  write_safetensors(p, {{"topk_ids", Tensor::from<int32_t>({0, 1, 0, 1}, {1, 2, 2})}});
  expect_one_line_error(run_r3("forward -q" + kQwen + " --replay " + p), p + ": the routing has 2 MoE layers");
}

}  // namespace
}  // namespace r3::test
