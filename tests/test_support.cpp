#include "test_support.h"

#include "models/registry.h"
#include "moe/routing_capturer.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace r3::test {

namespace fs = std::filesystem;

std::string data_dir() { return R3_TEST_DATA_DIR; }
std::string family_dir(const std::string& family) { return data_dir() + "/" + family; }
std::string r3_binary() { return R3_BINARY; }

TempDir::TempDir() {
  std::random_device rd;
  dir_ = fs::temp_directory_path() / ("r3-test-" + std::to_string(rd()) + std::to_string(rd()));
  fs::create_directories(dir_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string TempDir::path(const std::string& name) const {
  return name.empty() ? dir_.string() : (dir_ / name).string();
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

CommandResult run_r3(const std::string& args, int timeout_s) {
  TempDir tmp;
  const std::string out = tmp.path("out"), err = tmp.path("err");
  const std::string limit = timeout_s > 0 ? "timeout -k 5 " + std::to_string(timeout_s) + " " : "";
  const std::string cmd = limit + r3_binary() + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

testing::AssertionResult refused_with(const CommandResult& r, const std::string& needle) {
  const auto lines = std::count(r.err.begin(), r.err.end(), '\n');
  if (r.exit_code == 1 && r.err.rfind("r3: error: ", 0) == 0 && lines == 1 && r.err.back() == '\n' &&
      r.err.find(needle) != std::string::npos) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure() << "expected exit 1 and one line 'r3: error: ...' containing '" << needle
                                     << "'; got exit " << r.exit_code << " and stderr: " << r.err;
}

std::vector<double> read_as_f64(const SafetensorsFile& file, const std::string& name) {
  Tensor t = file.view(name);
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  if (t.dtype() == DType::F64) {
    std::memcpy(out.data(), bytes, out.size() * sizeof(double));
  } else {
    std::vector<float> f(out.size());
    convert_to_f32(bytes, t.dtype(), f.size(), f.data());
    std::copy(f.begin(), f.end(), out.begin());
  }
  return out;
}

std::vector<int64_t> read_as_i64(const SafetensorsFile& file, const std::string& name) {
  Tensor t = file.view(name);
  std::vector<int64_t> out(static_cast<std::size_t>(t.numel()));
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (t.dtype() == DType::I64) {
      std::memcpy(&out[i], bytes + 8 * i, 8);
    } else if (t.dtype() == DType::I32) {
      int32_t v;
      std::memcpy(&v, bytes + 4 * i, 4);
      out[i] = v;
    } else {
      R3_FAIL("read_as_i64: ", name, " is ", dtype_name(t.dtype()));
    }
  }
  return out;
}

Reference load_reference(const std::string& family, int index) {
  const std::string dir = family_dir(family);
  auto file = SafetensorsFile::open(dir + "/reference_" + std::to_string(index) + ".safetensors");
  std::ifstream in(dir + "/reference.json");
  const auto meta = nlohmann::json::parse(in);
  const auto& seq = meta.at("sequences").at(static_cast<std::size_t>(index));
  Reference r;
  r.input_ids = read_as_i64(*file, "input_ids");
  r.prompt_len = seq.at("prompt_len").get<int64_t>();
  r.generated = seq.at("generated").get<std::vector<int64_t>>();
  r.moe_layers = seq.at("moe_layers").get<std::vector<int64_t>>();
  r.generate_agrees = seq.value("f64_greedy_agrees_with_f32_generate", true);
  r.logits = read_as_f64(*file, "logits");
  r.topk_ids = read_as_i64(*file, "topk_ids");
  r.topk_weights = read_as_f64(*file, "topk_weights");
  r.router_logits = read_as_f64(*file, "router_logits");
  r.experts = file->find("router_logits")->shape[2];
  const Shape& ids_shape = file->find("topk_ids")->shape;
  r.tokens = ids_shape[0];
  r.layers = ids_shape[1];
  r.top_k = ids_shape[2];
  r.vocab = file->find("logits")->shape[1];
  return r;
}

std::string join(const std::vector<int64_t>& values, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? separator : "") + std::to_string(values[i]);
  return out;
}

std::string copy_model_with_config(const std::string& family, const TempDir& dir, const std::string& name,
                                   const std::string& key, const std::string& value_json) {
  const fs::path to = dir.path(name);
  fs::copy(family_dir(family), to, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(slurp((to / "config.json").string()));
  config[key] = nlohmann::json::parse(value_json);
  std::ofstream((to / "config.json").string()) << config.dump(2);
  return to.string();
}

EosModel make_eos_model(const TempDir& dir, const std::string& family, const std::string& prompt,
                        int max_new_tokens) {
  EosModel m;
  const CommandResult free_run = run_r3("generate -q --json --ignore-eos --model " + family_dir(family) +
                                        " --ids " + prompt + " --max-new-tokens " + std::to_string(max_new_tokens));
  R3_CHECK(free_run.exit_code == 0, "free run failed: ", free_run.err);
  m.free_json = free_run.out;
  m.free_output = nlohmann::json::parse(free_run.out).at("output_ids").get<std::vector<int32_t>>();
  for (std::size_t i = 2; i < m.free_output.size() && m.eos < 0; ++i) {
    const auto first = std::find(m.free_output.begin(), m.free_output.end(), m.free_output[i]);
    if (static_cast<std::size_t>(first - m.free_output.begin()) == i) {
      m.eos = m.free_output[i];
      m.eos_index = i;
    }
  }
  R3_CHECK(m.eos >= 0, "no token of ", free_run.out, " can serve as EOS");
  m.dir = copy_model_with_config(family, dir, "eos_model", "eos_token_id", std::to_string(m.eos));
  return m;
}

Tensor forward_captured(models::CausalLM& model, backend::Context& ctx, models::ForwardBatch batch,
                        models::ModelCache& cache) {
  const models::ModelInfo& info = model.info();
  moe::RoutingCapturer capturer(batch.size(), static_cast<int64_t>(info.moe_layers.size()), info.top_k,
                                info.num_experts);
  capturer.begin_step(batch.size());
  batch.capture = &capturer;
  Tensor logits = model.forward(ctx, batch, cache);
  capturer.end_step();
  return logits;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> float_values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

Tensor random_normal(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

void expect_resident_near_file_size(const std::string& model) {
  const auto file_bytes = static_cast<double>(std::filesystem::file_size(model + "/model.safetensors"));
  ASSERT_GT(file_bytes, 250e6) << "a checkpoint of a few hundred MB";
  struct Resident {
    double file = 0, anon = 0;  // RssFile and RssAnon of /proc/self/status, in bytes
  };
  auto resident = [] {
    Resident r;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("RssFile:", 0) == 0) r.file = static_cast<double>(std::stoll(line.substr(8)) * 1024);
      if (line.rfind("RssAnon:", 0) == 0) r.anon = static_cast<double>(std::stoll(line.substr(8)) * 1024);
    }
    return r;
  };
  const Resident before = resident();
  auto loaded = models::load_model(model);
  auto check = [&](const char* when) {
    const Resident now = resident();
    const double mapped = now.file - before.file, owned = now.anon - before.anon;
    const std::string growth = std::string(when) + ": file-backed +" + std::to_string(mapped / 1e6) +
                               " MB, private +" + std::to_string(owned / 1e6) + " MB for a " +
                               std::to_string(file_bytes / 1e6) + " MB checkpoint";
    std::printf("%s\n", growth.c_str());
    SCOPED_TRACE(growth);
    EXPECT_GE(mapped, 0.9 * file_bytes) << "the weights are the file's own pages";
    EXPECT_LE(mapped + owned, 1.3 * file_bytes);
  };
  check("loaded");
  backend::Context ctx(2);
  auto cache = loaded->make_cache(1, 16);
  const std::vector<int32_t> ids = {1, 7, 300, 42, 9, 511, 64, 3};
  const Tensor logits = forward_captured(*loaded, ctx, models::ForwardBatch::sequence(ids, 0), *cache);
  for (const float v : float_values(logits)) ASSERT_TRUE(std::isfinite(v));
  check("after a forward pass");
}

}  // namespace r3::test
