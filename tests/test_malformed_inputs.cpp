// The malformed-input suite: every folder under tests/malformed (written by
// tools/make_malformed_inputs.py) is one test. Its files are copied to a temporary folder, the
// setup steps of its case.json are applied there (fixture copies, FIFOs, symlinks, sparse files),
// r3 runs the case's command under a time limit, and the exit status and the whole of standard
// error must be exactly what case.json says: one line `r3: error: ...`.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace r3::test {
namespace {

namespace fs = std::filesystem;

fs::path suite_dir() { return fs::path(data_dir()).parent_path() / "malformed"; }

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(suite_dir())) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// One argument for `sh -c`: single-quoted, so newlines and spaces pass through unchanged.
std::string shell_quote(const std::string& arg) {
  std::string quoted(1, '\'');
  for (const char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted.push_back(c);
    }
  }
  quoted.push_back('\'');
  return quoted;
}

// Applies one setup step of case.json inside `dir`.
void apply_setup(const nlohmann::json& step, const fs::path& dir) {
  auto at = [&](const char* key) {
    const fs::path p = dir / step.at(key).get<std::string>();
    fs::create_directories(p.parent_path());
    return p;
  };
  if (step.contains("copy")) {
    fs::copy_file(fs::path(data_dir()) / step.at("copy").get<std::string>(), at("to"));
  } else if (step.contains("fifo")) {
    ASSERT_EQ(::mkfifo(at("fifo").c_str(), 0600), 0) << step.dump();
  } else if (step.contains("symlink")) {
    fs::create_symlink(step.at("symlink").get<std::string>(), at("at"));
  } else if (step.contains("mkdir")) {
    fs::create_directories(at("mkdir"));
  } else if (step.contains("sparse")) {
    fs::resize_file(at("sparse"), step.at("bytes").get<uint64_t>());
  } else {
    FAIL() << "unknown setup step " << step.dump();
  }
}

class MalformedInput : public testing::TestWithParam<std::string> {};

TEST_P(MalformedInput, IsRefusedWithItsExactMessage) {
  const fs::path source = suite_dir() / GetParam();
  const nlohmann::json spec = nlohmann::json::parse(std::ifstream(source / "case.json"));
  TempDir tmp;
  const fs::path dir = fs::path(tmp.path("case"));
  fs::copy(source, dir, fs::copy_options::recursive);
  for (const auto& step : spec.at("setup")) apply_setup(step, dir);

  auto expand = [&](const std::string& text) {
    return replace_all(replace_all(text, "{case}", dir.string()), "{data}", data_dir());
  };
  std::string args;
  for (const auto& arg : spec.at("args")) {
    args.push_back(' ');
    args += shell_quote(expand(arg.get<std::string>()));
  }
  // The hang cases would block forever without their checks: 60 s is far above what any refusal
  // takes.
  const CommandResult r = run_r3(args, 60);
  SCOPED_TRACE(spec.at("about").get<std::string>());
  EXPECT_EQ(r.exit_code, spec.at("exit").get<int>()) << "124: it ran until the time limit";
  EXPECT_EQ(r.err, expand(spec.at("stderr").get<std::string>()));
}

// gtest names allow letters, digits and '_': case folders use '-'.
std::string test_name(const testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Suite, MalformedInput, testing::ValuesIn(case_names()), test_name);

}  // namespace
}  // namespace r3::test
