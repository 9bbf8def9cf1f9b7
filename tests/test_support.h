// Shared helpers for the test suite: fixture paths, temporary folders, running the r3 binary,
// and reading reference fixtures in float64.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/context.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"

namespace r3::test {

std::string data_dir();                  // tests/data
std::string family_dir(const std::string& family);
std::string r3_binary();                 // the built r3 executable

// A fresh folder under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name = "") const;

 private:
  std::filesystem::path dir_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs `r3 <args>` (args already shell-quoted where needed) with stdin empty. With timeout_s > 0
// it is killed after that many seconds and exits 124 (a refusal that blocks shows up as that).
CommandResult run_r3(const std::string& args, int timeout_s = 0);

// A refusal as the CLI must give one: exit status 1 and standard error exactly one line
// `r3: error: ...` that contains `needle`.
testing::AssertionResult refused_with(const CommandResult& r, const std::string& needle);

// Tensor `name` of a safetensors file, converted to double / int64 whatever its stored dtype.
std::vector<double> read_as_f64(const SafetensorsFile& file, const std::string& name);
std::vector<int64_t> read_as_i64(const SafetensorsFile& file, const std::string& name);

// One reference sequence of a family fixture (tests/data/<family>/reference_<i>.safetensors).
struct Reference {
  std::vector<int64_t> input_ids;  // prompt + generated
  int64_t prompt_len = 0;
  std::vector<int64_t> generated;
  // False where transformers' float32 generate left its own float64 forward's argmax (Kimi
  // Linear's second sequence): the stored tokens are then not what an exact greedy run produces.
  bool generate_agrees = true;
  std::vector<int64_t> moe_layers;
  int64_t tokens = 0;  // T = input_ids.size() - 1
  int64_t vocab = 0, layers = 0, top_k = 0;
  std::vector<double> logits;        // [T, V]
  std::vector<int64_t> topk_ids;     // [T, L, K]
  std::vector<double> topk_weights;  // [T, L, K]
  std::vector<double> router_logits;  // [T, L, E]
  int64_t experts = 0;
};
Reference load_reference(const std::string& family, int index);

// model.forward(batch) with a capture buffer of its own for the step (MoE layers need one); the
// captured routing is dropped.
Tensor forward_captured(models::CausalLM& model, backend::Context& ctx, models::ForwardBatch batch,
                        models::ModelCache& cache);

// The message of the r3::Error that fn() throws, or "" when it throws none.
std::string error_of(const std::function<void()>& fn);

// The values of an F32 tensor, in order.
std::vector<float> float_values(const Tensor& t);

// F32 tensor of N(0, 1) values from mt19937(seed).
Tensor random_normal(Shape shape, uint32_t seed);

std::string join(const std::vector<int64_t>& values, const std::string& separator = ",");

// A copy of fixture model `family` in dir.path(name) whose config.json has `key` set to
// `value_json` (JSON text); returns the copy's folder.
std::string copy_model_with_config(const std::string& family, const TempDir& dir, const std::string& name,
                                   const std::string& key, const std::string& value_json);

// Loads the checkpoint folder `model` (one model.safetensors of a few hundred MB) and runs a
// forward pass of 8 tokens; after each, the process's resident memory must have grown by the
// file's own pages (file-backed, >= 0.9x the file) and by at most 1.3x the file in all
// (file-backed plus private): weights read as views of the file, no widened copy.
void expect_resident_near_file_size(const std::string& model);

// A generation that really ends at EOS: greedy `r3 generate --ignore-eos` of `prompt` on fixture
// `family` picks the token, the first one it emits for the first time at output index >= 2, and
// a copy of the model declares that token its eos_token_id.
struct EosModel {
  std::string dir;                   // the copy with eos_token_id set
  int32_t eos = -1;
  std::vector<int32_t> free_output;  // output_ids of the run that ignored EOS
  std::size_t eos_index = 0;         // where eos first appears in free_output
  std::string free_json;             // that run's --json output
};
EosModel make_eos_model(const TempDir& dir, const std::string& family, const std::string& prompt,
                        int max_new_tokens);

}  // namespace r3::test
