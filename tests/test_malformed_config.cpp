// Malformed configs, options and runtime bounds: each one is refused with one line
// `r3: error: ...` naming the file, field or option, and a non-zero exit; nothing wraps, hangs
// or allocates without bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

#include "io/hf_config.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

constexpr const char* kInt64Max = "9223372036854775807";

// A refusal: non-zero exit, stderr exactly one line `r3: error: ...` holding `needle`.
void expect_refused(const CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind("r3: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

std::string generate_args(const std::string& model, const std::string& extra, const std::string& ids = "17,42,7") {
  return "generate -q --model " + model + " --ids " + ids + " " + extra;
}

// `r3 generate` on a copy of fixture `family` whose config.json has `key` = `value_json`.
CommandResult generate_with(const std::string& family, const std::string& key, const std::string& value_json,
                            const std::string& extra = "--max-new-tokens 2") {
  TempDir dir;
  const std::string model = copy_model_with_config(family, dir, "m", key, value_json);
  return run_r3(generate_args(model, extra));
}

// --- 1. signed overflow / silent wrap -------------------------------------------------------

TEST(MalformedConfig, MaxNewTokensNearInt64MaxIsRefused) {
  expect_refused(run_r3(generate_args(family_dir("qwen3_moe"), std::string("--max-new-tokens ") + kInt64Max)),
                 "--max-new-tokens");
}

TEST(MalformedConfig, RedundantExpertsNearInt64MaxIsRefused) {
  expect_refused(run_r3(generate_args(family_dir("qwen3_moe"),
                                      std::string("--max-new-tokens 1 --eplb-redundant-experts ") + kInt64Max)),
                 "--eplb-redundant-experts");
}

TEST(MalformedConfig, EplbWindowNearInt64MaxIsRefused) {
  expect_refused(run_r3(generate_args(family_dir("qwen3_moe"), std::string("--max-new-tokens 1 --eplb-window ") +
                                                                   kInt64Max + " --eplb-rebalance-every 1")),
                 "--eplb-window");
}

TEST(MalformedConfig, HeadsTimesHeadDimOverflowIsRefused) {
  expect_refused(generate_with("qwen3_moe", "head_dim", "4611686018427387904"), "'head_dim'");
  expect_refused(generate_with("qwen3_moe", "num_attention_heads", "4611686018427387904"), "'num_attention_heads'");
}

TEST(MalformedConfig, LatentDimsOverflowIsRefused) {
  expect_refused(generate_with("deepseek_v3", "v_head_dim", "4611686018427387904"), "'v_head_dim'");
  expect_refused(generate_with("deepseek_v3", "qk_nope_head_dim", kInt64Max), "'qk_nope_head_dim'");
}

TEST(MalformedConfig, SharedExpertsOverflowIsRefused) {
  // x moe_intermediate_size wraps to 0 today: the shared experts would be silently dropped.
  expect_refused(generate_with("deepseek_v3", "n_shared_experts", "4611686018427387904"), "'n_shared_experts'");
  expect_refused(generate_with("deepseek_v3", "n_shared_experts", "-1"), "'n_shared_experts'");
}

TEST(MalformedConfig, HcMultOverflowIsRefused) {
  expect_refused(generate_with("deepseek_v4", "hc_mult", "4611686018427387904"), "'hc_mult'");
}

// --- 2. accepted but must be refused --------------------------------------------------------

TEST(MalformedConfig, EosTokenIdOutOfInt32IsRefused) {
  expect_refused(generate_with("qwen3_moe", "eos_token_id", "4294967364"), "'eos_token_id'");
  expect_refused(generate_with("qwen3_moe", "eos_token_id", "[1, 4294967364]"), "'eos_token_id'");
}

TEST(MalformedConfig, IntegerBeyondInt64IsRefused) {
  expect_refused(generate_with("qwen3_moe", "eos_token_id", "18446744073709551615"), "'eos_token_id'");
}

TEST(MalformedConfig, DeepseekV4WithoutLayersIsRefused) {
  expect_refused(generate_with("deepseek_v4", "num_hidden_layers", "0"), "'num_hidden_layers'");
  expect_refused(generate_with("deepseek_v4", "num_hidden_layers", "-1"), "'num_hidden_layers'");
}

TEST(MalformedConfig, NonStringLayerTypesAreRefused) {
  expect_refused(generate_with("gpt_oss", "layer_types", "[1, 2]"), "'layer_types'");
  expect_refused(generate_with("deepseek_v4", "mlp_layer_types", "[1, 2, 3, 4]"), "'mlp_layer_types'");
}

// --- 3. hangs ---------------------------------------------------------------------------------

TEST(MalformedConfig, HugeLayerCountIsRefusedBeforeLooping) {
  expect_refused(generate_with("qwen3_moe", "num_hidden_layers", "8589934592"), "'num_hidden_layers'");
  expect_refused(generate_with("deepseek_v4", "num_hidden_layers", "8589934592"), "'num_hidden_layers'");
  // Within the bound, but more layers than the checkpoint holds: refused before the layers load.
  expect_refused(generate_with("qwen3_moe", "num_hidden_layers", "1000"), "num_hidden_layers");
  expect_refused(generate_with("deepseek_v4", "num_hidden_layers", "1000"), "num_hidden_layers");
}

TEST(MalformedConfig, HugeSinkhornIterationsAreRefused) {
  expect_refused(generate_with("deepseek_v4", "hc_sinkhorn_iters", "1000000000000"), "'hc_sinkhorn_iters'");
}

TEST(MalformedConfig, ThreadCreationFailureIsAnErrorNotADeadlock) {
  // A process limit of 20 threads for the user: thread creation fails part way through the pool.
  // Root ignores RLIMIT_NPROC, so as root the command runs as `nobody` (setpriv). An address-space
  // limit would do it too, but the sanitizer build cannot run under one. `timeout` ends a hang.
  TempDir tmp;
  std::filesystem::permissions(tmp.path(), std::filesystem::perms::all);  // `nobody` writes err here
  const std::string as_user = ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  const std::string cmd = "ulimit -u 20; timeout 60 " + r3_binary() + " generate -q --model " + family_dir("qwen3_moe") +
                          " --ids 17,42,7 --max-new-tokens 1 --threads 512 >/dev/null 2>" + tmp.path("err");
  const int status = std::system((as_user + "bash -c '" + cmd + "'").c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(tmp.path("err"));
  std::stringstream err;
  err << in.rdbuf();
  r.err = err.str();
  EXPECT_NE(r.exit_code, 124) << "timed out: the thread pool deadlocked";
  expect_refused(r, "--threads");
}

TEST(MalformedConfig, PromptBeyondMaxPositionEmbeddingsIsRefused) {
  std::string ids = "1";
  for (int i = 0; i < 299; ++i) ids += ",1";
  expect_refused(run_r3(generate_args(family_dir("qwen3_moe"), "--max-new-tokens 1", ids)),
                 "max_position_embeddings");
  expect_refused(run_r3("forward -q --model " + family_dir("qwen3_moe") + " --ids " + ids),
                 "max_position_embeddings");
  expect_refused(run_r3(generate_args(family_dir("qwen3_moe"), "--max-new-tokens 10000000")),
                 "max_position_embeddings");
  // The limit itself still runs.
  EXPECT_EQ(run_r3(generate_args(family_dir("qwen3_moe"), "--max-new-tokens 253")).exit_code, 0);
}

// --- 4. runaway allocation --------------------------------------------------------------------

TEST(MalformedConfig, OversizedKvCacheIsRefused) {
  auto model = models::load_model(family_dir("qwen3_moe"), {});
  std::string message;
  try {
    model->make_cache(1, int64_t{1} << 30);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("KV cache"), std::string::npos) << message;
  EXPECT_NE(message.find("memory"), std::string::npos) << message;
}

TEST(MalformedConfig, RedundantExpertsBeyondModelBoundAreRefused) {
  // qwen3_moe has 8 experts: at most 8 x 4 = 32 redundant replicas.
  expect_refused(run_r3(generate_args(family_dir("qwen3_moe"), "--max-new-tokens 1 --eplb-redundant-experts 1000000")),
                 "--eplb-redundant-experts");
  expect_refused(run_r3(generate_args(family_dir("deepseek_v4"),
                                      "--max-new-tokens 1 --eplb-redundant-experts 1000000")),
                 "--eplb-redundant-experts");
  TempDir tmp;
  std::ofstream(tmp.path("load.json")) << "[1, 2, 3, 4, 5, 6, 7, 8]";
  expect_refused(run_r3("eplb-plan --load " + tmp.path("load.json") + " --redundant-experts 1000000000"),
                 "--redundant-experts");
  EXPECT_EQ(run_r3("eplb-plan --load " + tmp.path("load.json") + " --redundant-experts 32 --gpus 4").exit_code, 0);
}

// --- 5. messages ------------------------------------------------------------------------------

TEST(MalformedConfig, IdsWithNewlineGiveOneLine) {
  expect_refused(run_r3("generate -q --model " + family_dir("qwen3_moe") + " --ids \"$(printf '1\\n2')\""),
                 "--ids");
}

// --- 6. configs that make every logit NaN -----------------------------------------------------

TEST(MalformedConfig, NanMakingConfigsAreRefused) {
  expect_refused(generate_with("qwen3_moe", "rms_norm_eps", "-1e-6"), "'rms_norm_eps'");
  expect_refused(generate_with("qwen3_moe", "rope_parameters", R"({"rope_type": "default", "rope_theta": 0})"),
                 "'rope_theta'");
  expect_refused(generate_with("qwen3_moe", "rope_parameters", R"({"rope_type": "default", "rope_theta": -1e4})"),
                 "'rope_theta'");
  expect_refused(generate_with("qwen3_moe", "rope_parameters",
                               R"({"rope_type": "yarn", "rope_theta": 1e4, "factor": 0,
                                   "original_max_position_embeddings": 64})"),
                 "'factor'");
  expect_refused(generate_with("deepseek_v4", "rms_norm_eps", "-1"), "'rms_norm_eps'");
  expect_refused(generate_with("deepseek_v4", "rope_theta", "0"), "'rope_theta'");
  expect_refused(generate_with("deepseek_v4", "compress_rope_theta", "-1"), "'compress_rope_theta'");
}

}  // namespace
}  // namespace r3::test

// --- config.json through the one file reader -------------------------------------------------
namespace r3::test {
namespace {

// A copy of the qwen3_moe fixture whose config.json text is `config_text`.
std::string model_with_config_text(const TempDir& dir, const std::string& config_text) {
  const std::string to = dir.path("m");
  std::filesystem::copy(family_dir("qwen3_moe"), to, std::filesystem::copy_options::recursive);
  std::ofstream(to + "/config.json") << config_text;
  return to;
}

// 500k levels of nesting used to overflow the stack (SIGSEGV) while parsing or printing.
TEST(MalformedConfig, DeeplyNestedConfigIsRefusedAtParseTime) {
  TempDir dir;
  nlohmann::json config = nlohmann::json::parse(std::ifstream(family_dir("qwen3_moe") + "/config.json"));
  config.erase("hidden_size");
  std::string text = config.dump();
  text.pop_back();  // the closing brace: hidden_size goes in as raw text
  const int levels = 500000;
  text += ", \"hidden_size\": " + std::string(levels, '[') + "1" + std::string(levels, ']') + "}";
  const std::string model = model_with_config_text(dir, text);
  expect_refused(run_r3(generate_args(model, "--max-new-tokens 2")),
                 model + "/config.json: JSON nested deeper than 64 levels");
}

// A FIFO as config.json used to block in open() forever.
TEST(MalformedConfig, FifoAsConfigIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string model = model_with_config_text(dir, "{}");
  std::filesystem::remove(model + "/config.json");
  ASSERT_EQ(::mkfifo((model + "/config.json").c_str(), 0600), 0);
  const std::string cmd = "timeout 30 " + r3_binary() + " " + generate_args(model, "--max-new-tokens 2") +
                          " >/dev/null 2>" + dir.path("err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << "124 means it blocked until the timeout";
  std::stringstream err;
  err << std::ifstream(dir.path("err")).rdbuf();
  EXPECT_EQ(err.str(), "r3: error: cannot read " + model + "/config.json: not a regular file\n");
}

}  // namespace
}  // namespace r3::test
