// Bounds on configs, options and runtime sizes that the malformed-input suite
// (tests/malformed, run by test_malformed_inputs.cpp) cannot express as files: a process limit
// on threads, the KV cache bound of the library, and the limits themselves still being accepted.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

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
  std::stringstream err;
  err << std::ifstream(tmp.path("err")).rdbuf();
  r.err = err.str();
  EXPECT_NE(r.exit_code, 124) << "timed out: the thread pool deadlocked";
  EXPECT_TRUE(refused_with(r, "--threads"));
}

TEST(MalformedConfig, TheBoundsThemselvesAreAccepted) {
  // qwen3_moe: max_position_embeddings 256, 8 experts (so at most 32 redundant replicas).
  const std::string model = " --model " + family_dir("qwen3_moe") + " --ids 17,42,7";
  EXPECT_EQ(run_r3("generate -q" + model + " --max-new-tokens 253").exit_code, 0);
  EXPECT_EQ(run_r3("generate -q" + model + " --max-new-tokens 1 --eplb-redundant-experts 32").exit_code, 0);
  EXPECT_EQ(run_r3("generate -q" + model + " --max-new-tokens 1 --eplb-window 100000 --eplb-rebalance-every 1").exit_code,
            0);
  TempDir tmp;
  std::ofstream(tmp.path("load.json")) << "[1, 2, 3, 4, 5, 6, 7, 8]";
  EXPECT_EQ(run_r3("eplb-plan --load " + tmp.path("load.json") + " --redundant-experts 32 --gpus 4").exit_code, 0);
}

TEST(MalformedConfig, OversizedKvCacheIsRefused) {
  auto model = models::load_model(family_dir("qwen3_moe"), {});
  const std::string message = error_of([&] { model->make_cache(1, int64_t{1} << 30); });
  EXPECT_NE(message.find("KV cache"), std::string::npos) << message;
  EXPECT_NE(message.find("memory"), std::string::npos) << message;
}

}  // namespace
}  // namespace r3::test
