// The r3 command line as a user meets it: help, one-line errors with non-zero exits, the
// human-readable output, and timing lines on stderr.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace r3::test {
namespace {

int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

TEST(Cli, HelpOnEveryCommand) {
  for (const std::string cmd : {"--help", "forward --help", "generate --help"}) {
    const CommandResult r = run_r3(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd << ": " << r.out;
  }
  EXPECT_NE(run_r3("generate --help").out.find("--max-new-tokens"), std::string::npos);
  EXPECT_NE(run_r3("forward --help").out.find("--dump"), std::string::npos);
}

TEST(Cli, BadArgumentsGiveOneLineErrorAndNonZeroExit) {
  const std::string model = " --model " + family_dir("qwen3_moe");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "subcommand"},
      {"frobnicate", "frobnicate"},
      {"generate" + model, "--ids is required"},
      {"generate --ids 1,2", "--model is required"},
      {"generate" + model + " --ids 1,x,3", "bad token id 'x'"},
      {"generate" + model + " --ids ''", "bad token id ''"},
      {"generate" + model + " --ids 1,-4", "bad token id '-4'"},
      {"generate" + model + " --ids 1,2 --max-new-tokens 0", "max-new-tokens"},
      {"generate" + model + " --ids 1,2 --temperature -1", "temperature"},
      {"generate" + model + " --ids 1,2 --top-p 2", "top-p"},
      {"generate" + model + " --ids 1,99999", "token id 99999 is outside the vocabulary [0, 320)"},
      {"forward" + model + " --ids 1,320", "token id 320 is outside the vocabulary"},
      {"forward --model /nonexistent --ids 1", "/nonexistent"},
      {"forward --model " + data_dir() + " --ids 1", "config.json"},
      {"forward" + model + " --ids 1 --dump /nonexistent/dir/out.safetensors", "cannot write"},
      {"generate" + model + " --ids 1,2 --moe-backend turbo", "--moe-backend"},
      {"generate" + model + " --ids 1,2 --moe-backend monolithic-nocapture",
       "Routed-experts capture is not supported with monolithic MoE kernel cpu-fused-softmax-topk-nocapture."},
      {"generate" + model + " --ids 1,2 --eplb-redundant-experts -1", "--eplb-redundant-experts"},
      {"generate" + model + " --ids 1,2 --eplb-redundant-experts 1 --eplb-gpus 2 --eplb-rebalance-every 1",
       "9 physical experts do not split over 2 GPUs"},
      {"eplb-plan --load /nonexistent.json", "cannot read /nonexistent.json"},
  };
  for (const auto& [args, expected] : cases) {
    const CommandResult r = run_r3(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(r.out, "") << args;
    // One line: the error, after any info lines the command printed before failing.
    const std::string last = r.err.substr(r.err.rfind("r3: "));
    EXPECT_EQ(count_lines(last), 1) << args << "\n" << r.err;
    EXPECT_NE(last.find(expected), std::string::npos) << args << "\n" << r.err;
  }
}

TEST(Cli, EplbPlanPrintsPlacementAndBalance) {
  TempDir tmp;
  std::ofstream(tmp.path("load.json")) << "[[90, 5, 5, 5, 5, 5, 5, 5], [10, 10, 10, 10, 10, 10, 10, 10]]";
  const CommandResult r = run_r3("eplb-plan --load " + tmp.path("load.json") + " --redundant-experts 4 --gpus 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layer 0: 8 experts on 12 physical slots, 4 GPUs (3 per GPU)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 1:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max/mean GPU load:"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(
      run_r3("eplb-plan --json --load " + tmp.path("load.json") + " --redundant-experts 4 --gpus 4").out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["physical_to_logical"].size(), 12u);
  EXPECT_LT(j[0]["imbalance_after"].get<double>(), j[0]["imbalance_before"].get<double>());
  EXPECT_EQ(j[0]["replica_count"][0].get<int>(), 5);  // the hot expert takes every extra slot
}

TEST(Cli, GenerateShowsTokensRoutingAndTimings) {
  const CommandResult r =
      run_r3("generate --model " + family_dir("qwen3_moe") + " --ids 17,42,7 --max-new-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prompt ids: 17 42 7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output ids: "), std::string::npos);
  // 3 + 4 - 1 = 6 routed rows, 3 MoE layers, top-2.
  EXPECT_NE(r.out.find("routed experts: 6 rows x 3 MoE layers (layers 0,1,2) x top-2"),
            std::string::npos) << r.out;
  EXPECT_NE(r.err.find("loaded"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prefill 3 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode 3 steps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST(Cli, SampledGenerationIsReproducibleBySeed) {
  const std::string args = "generate -q --json --model " + family_dir("olmoe") +
                           " --ids 5,6,7 --max-new-tokens 10 --temperature 1.0 --top-p 0.9 --seed ";
  const auto a = nlohmann::json::parse(run_r3(args + "3").out);
  const auto b = nlohmann::json::parse(run_r3(args + "3").out);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.at("output_ids").size(), 10u);
  EXPECT_EQ(a.at("routed_experts").size(), 12u);
}

TEST(Cli, GenerationStopsAtEos) {
  // Find what greedy decoding produces, then declare its third token the end of sequence.
  const std::string dir = family_dir("mixtral");
  const auto free_run = nlohmann::json::parse(
      run_r3("generate -q --json --ignore-eos --model " + dir + " --ids 9,8,7 --max-new-tokens 6").out);
  const auto tokens = free_run.at("output_ids").get<std::vector<int>>();
  // Mixtral's config says eos_token_id 2; without --ignore-eos generation ends on it.
  const auto stopped = nlohmann::json::parse(
      run_r3("generate -q --json --model " + dir + " --ids 9,8,7 --max-new-tokens 6").out);
  const auto out = stopped.at("output_ids").get<std::vector<int>>();
  const auto eos = std::find(tokens.begin(), tokens.end(), 2);
  const auto expected_len = eos == tokens.end() ? tokens.size() : static_cast<std::size_t>(eos - tokens.begin() + 1);
  EXPECT_EQ(out.size(), expected_len);
  EXPECT_EQ(stopped.at("routed_experts").size(), 3 + out.size() - 1);
}

}  // namespace
}  // namespace r3::test
