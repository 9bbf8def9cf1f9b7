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
      {"generate" + model, "give a prompt: --ids 3,17,42 (repeatable) or --ids-file FILE"},
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
      {"generate" + model + " --ids 1,2 --moe-path turbo", "--moe-path"},
      {"generate" + model + " --ids 1,2 --moe-backend turbo", "--moe-path"},  // the alias, same option
      {"generate" + model + " --ids 1,2 --moe-path monolithic-nocapture",
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
  EXPECT_NE(r.out.find("layer 0: 8 experts on 12 physical experts, 4 GPUs (3 per GPU)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 1:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max/mean GPU load:"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(
      run_r3("eplb-plan --json --load " + tmp.path("load.json") + " --redundant-experts 4 --gpus 4").out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["physical_to_logical"].size(), 12u);
  EXPECT_LT(j[0]["imbalance_after"].get<double>(), j[0]["imbalance_before"].get<double>());
  EXPECT_EQ(j[0]["replica_count"][0].get<int>(), 5);  // the hot expert takes every extra replica
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

// A copy of qwen3_moe whose eos_token_id is a token greedy decoding really emits (see
// make_eos_model): generation must stop right after it.
TEST(Cli, GenerationStopsAtEos) {
  TempDir tmp;
  const EosModel m = make_eos_model(tmp, "qwen3_moe", "17,42,7,99", 8);
  const CommandResult r = run_r3("generate -q --json --model " + m.dir + " --ids 17,42,7,99 --max-new-tokens 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int32_t> expected(m.free_output.begin(), m.free_output.begin() + m.eos_index + 1);
  EXPECT_EQ(nlohmann::json::parse(r.out).at("output_ids").get<std::vector<int32_t>>(), expected) << r.out;
  EXPECT_LT(expected.size(), m.free_output.size());  // it did stop early
  // --ignore-eos on the same copy runs to max-new-tokens, as the free run did.
  const auto ignored = nlohmann::json::parse(
      run_r3("generate -q --json --ignore-eos --model " + m.dir + " --ids 17,42,7,99 --max-new-tokens 8").out);
  EXPECT_EQ(ignored.at("output_ids").get<std::vector<int32_t>>(), m.free_output);
}

TEST(Cli, EosStoppedRunHasPromptPlusGeneratedMinusOneRows) {
  TempDir tmp;
  const EosModel m = make_eos_model(tmp, "qwen3_moe", "17,42,7,99", 8);
  const CommandResult r = run_r3("generate -q --json --model " + m.dir + " --ids 17,42,7,99 --max-new-tokens 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto stopped = nlohmann::json::parse(r.out);
  const std::size_t generated = stopped.at("output_ids").size();
  ASSERT_EQ(generated, m.eos_index + 1);
  const auto& rows = stopped.at("routed_experts");
  EXPECT_EQ(rows.size(), 4 + generated - 1);
  // Those rows are the free run's first rows: stopping changes nothing before the stop.
  const auto free_rows = nlohmann::json::parse(m.free_json).at("routed_experts");
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i], free_rows[i]) << "row " << i;
}

// CLI11's own checks would say "Value 0 not in range 0.000000 to 1797693...": each numeric option
// says what it needs instead.
TEST(Cli, NumericOptionsSayWhatTheyNeed) {
  const std::string gen = "generate --model " + family_dir("qwen3_moe") + " --ids 1,2 ";
  const std::string plan = "eplb-plan --load /nonexistent.json ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {gen + "--max-new-tokens 0", "--max-new-tokens: must be an integer >= 1, got 0"},
      {gen + "--max-new-tokens abc", "--max-new-tokens: must be an integer >= 1, got 'abc'"},
      {gen + "--max-new-tokens 1.5", "--max-new-tokens: must be an integer >= 1, got '1.5'"},
      {gen + "--temperature -1", "--temperature: must be a number >= 0, got -1"},
      {gen + "--top-p 2", "--top-p: must be a number in (0, 1], got 2"},
      {gen + "--top-p 0", "--top-p: must be a number in (0, 1], got 0"},
      {gen + "--top-k -1", "--top-k: must be an integer >= 0, got -1"},
      {gen + "--threads -2", "--threads: must be an integer >= 0, got -2"},
      {gen + "--eplb-redundant-experts -1", "--eplb-redundant-experts: must be an integer >= 0, got -1"},
      {gen + "--eplb-window 0", "--eplb-window: must be an integer >= 1, got 0"},
      {gen + "--eplb-rebalance-every -1", "--eplb-rebalance-every: must be an integer >= 0, got -1"},
      {gen + "--eplb-groups 0", "--eplb-groups: must be an integer >= 1, got 0"},
      {gen + "--eplb-nodes 0", "--eplb-nodes: must be an integer >= 1, got 0"},
      {gen + "--eplb-gpus 0", "--eplb-gpus: must be an integer >= 1, got 0"},
      {plan + "--gpus 0", "--gpus: must be an integer >= 1, got 0"},
      {plan + "--nodes 0", "--nodes: must be an integer >= 1, got 0"},
      {plan + "--groups 0", "--groups: must be an integer >= 1, got 0"},
      {plan + "--redundant-experts -1", "--redundant-experts: must be an integer >= 0, got -1"},
  };
  for (const auto& [args, expected] : cases) {
    const CommandResult r = run_r3(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("not in range"), std::string::npos) << args << "\n" << r.err;
  }
  // A huge value is shortened in the message, not echoed whole.
  const CommandResult r = run_r3(gen + "--max-new-tokens " + std::string(500, '9'));
  EXPECT_NE(r.err.find("--max-new-tokens: must be an integer >= 1"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 200u) << r.err;
}

// A topology the rebalancer cannot place is refused at start-up, before any token runs, even
// when no rebalance would happen during the run.
TEST(Cli, EplbTopologyIsCheckedAtStartUp) {
  const std::string gen = "generate --model " + family_dir("qwen3_moe") + " --ids 1,2 --max-new-tokens 2 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {gen + "--eplb-redundant-experts 1 --eplb-gpus 2", "9 physical experts do not split over 2 GPUs"},
      {gen + "--eplb-redundant-experts 1 --eplb-gpus 2 --eplb-rebalance-every 100",
       "9 physical experts do not split over 2 GPUs"},
      {gen + "--eplb-rebalance-every 100 --eplb-groups 3", "8 experts do not split into 3 groups"},
      {gen + "--eplb-rebalance-every 100 --eplb-gpus 4 --eplb-nodes 3", "4 GPUs do not split over 3 nodes"},
      {"forward --model " + family_dir("qwen3_moe") + " --ids 1,2 --eplb-redundant-experts 2 --eplb-gpus 4 "
       "--eplb-rebalance-every 5", "10 physical experts do not split over 4 GPUs"},
  };
  for (const auto& [args, expected] : cases) {
    const CommandResult r = run_r3(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(r.err.find("prefill"), std::string::npos) << args << "\n" << r.err;  // nothing computed
    const std::string last = r.err.substr(std::min(r.err.size(), r.err.rfind("r3: error: ")));
    EXPECT_EQ(count_lines(last), 1) << args << "\n" << r.err;
    EXPECT_NE(last.find(expected), std::string::npos) << args << "\n" << r.err;
  }
  // A topology that fits runs.
  EXPECT_EQ(run_r3(gen + "--eplb-redundant-experts 2 --eplb-gpus 2 --eplb-nodes 2 --eplb-groups 2").exit_code, 0);
}

}  // namespace
// --moe-backend, the option's alias, selects the MoE path too.
TEST(Cli, MoeBackendIsAnAliasOfMoePath) {
  const std::string model = " --model " + family_dir("qwen3_moe") + " --ids 17,42,7 --max-new-tokens 3 --json -q";
  const CommandResult path = run_r3("generate" + model + " --moe-path mega");
  const CommandResult alias = run_r3("generate" + model + " --moe-backend mega");
  ASSERT_EQ(path.exit_code, 0) << path.err;
  ASSERT_EQ(alias.exit_code, 0) << alias.err;
  EXPECT_EQ(alias.out, path.out);
  const CommandResult loaded = run_r3("generate --model " + family_dir("qwen3_moe") + " --ids 17 --max-new-tokens 1 --moe-backend mega");
  EXPECT_NE(loaded.err.find("MoE path mega"), std::string::npos) << loaded.err;
}

}  // namespace r3::test

namespace r3::test {
namespace {

// Several prompts run together through the engine: one JSON line each, in input order, equal to
// the run of that prompt alone; --ids-file gives the same prompts line by line.
TEST(CliPrompts, SeveralPromptsEqualTheirSingleRuns) {
  const std::string gen = "generate -q --json --ignore-eos --max-new-tokens 5 --model " + family_dir("qwen3_moe");
  const std::vector<std::string> prompts = {"17,42,7", "3,1,4,1,5,9,2,6", "99"};
  std::string together_args = gen, expected;
  for (const auto& p : prompts) {
    const CommandResult alone = run_r3(gen + " --ids " + p);
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    expected += alone.out;
    together_args += " --ids " + p;
  }
  const CommandResult together = run_r3(together_args + " --max-running 2 --max-chunk 3");
  ASSERT_EQ(together.exit_code, 0) << together.err;
  EXPECT_EQ(together.out, expected);

  TempDir tmp;
  std::ofstream(tmp.path("prompts.txt")) << prompts[0] << "\n" << prompts[1] << "\r\n" << prompts[2] << "\n";
  const CommandResult from_file = run_r3(gen + " --ids-file " + tmp.path("prompts.txt"));
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_file.out, expected);
}

TEST(CliPrompts, BadPromptsFilesAndReplayOfSeveralAreRefused) {
  const std::string gen = "generate -q --model " + family_dir("qwen3_moe");
  TempDir tmp;
  std::ofstream(tmp.path("bad.txt")) << "1,2\n\n3\n";
  EXPECT_TRUE(refused_with(run_r3(gen + " --ids-file " + tmp.path("bad.txt")), tmp.path("bad.txt") + ":2 is empty"));
  std::ofstream(tmp.path("bad.txt")) << "1,2\n3,x\n";
  EXPECT_TRUE(refused_with(run_r3(gen + " --ids-file " + tmp.path("bad.txt")),
                           "bad token id 'x' in " + tmp.path("bad.txt") + ":2"));
  std::ofstream(tmp.path("empty.txt")) << "";
  EXPECT_TRUE(refused_with(run_r3(gen + " --ids-file " + tmp.path("empty.txt")), "holds no prompt"));
  std::ofstream(tmp.path("r.json")) << "[]";
  EXPECT_TRUE(refused_with(run_r3(gen + " --ids 1,2 --ids 3 --replay " + tmp.path("r.json")),
                           "--replay replays one prompt's routing; 2 prompts were given"));
  std::ofstream(tmp.path("good.txt")) << "5,6,7\n";
  EXPECT_TRUE(refused_with(run_r3(gen + " --ids 1,2 --ids-file " + tmp.path("good.txt") + " --max-new-tokens 254"),
                           tmp.path("good.txt") + ":1 has 3 tokens and --max-new-tokens is 254"));
}

}  // namespace
}  // namespace r3::test
