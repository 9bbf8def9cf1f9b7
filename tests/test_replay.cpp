// Replaying a routing: a captured routing reproduces the run bit for bit; a different routing
// changes the outputs and is what capture then returns; bad replay files are clear errors.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "engine/routing_replay.h"
#include "engine/step_runner.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

struct ForwardRun {
  std::vector<float> logits;
  std::vector<int32_t> routed;
};

ForwardRun forward(models::CausalLM& model, const std::vector<int32_t>& ids, const std::vector<int32_t>& forced) {
  backend::Context ctx(2);
  auto cache_owner = model.make_cache(1, static_cast<int64_t>(ids.size()));
  models::ModelCache& cache = *cache_owner;
  engine::StepRunner runner(model, ctx, cache, static_cast<int64_t>(ids.size()));
  engine::RoutedExperts routed(static_cast<int64_t>(model.info().moe_layers.size()), model.info().top_k);
  Tensor logits = runner.run({{0, ids, &routed, forced}}, 0, true);
  return {{logits.data<float>(), logits.data<float>() + logits.numel()}, routed.flat()};
}

TEST(Replay, CapturedRoutingReproducesLogitsBitForBit) {
  for (const std::string family : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "kimi_linear", "kimi_k3"}) {
    for (const std::string backend : {"modular", "monolithic", "mega"}) {
      models::LoadOptions options;
      options.moe_path = moe::parse_moe_path(backend);
      auto model = models::load_model(family_dir(family), options);
      const Reference ref = load_reference(family, 0);
      const std::vector<int32_t> ids(ref.input_ids.begin(), ref.input_ids.end() - 1);
      const ForwardRun free_run = forward(*model, ids, {});
      const ForwardRun replayed = forward(*model, ids, free_run.routed);
      EXPECT_EQ(replayed.logits, free_run.logits) << family << " " << backend;
      EXPECT_EQ(replayed.routed, free_run.routed) << family << " " << backend;

      // A different routing: every id moved to the next expert (still distinct per row).
      std::vector<int32_t> other = free_run.routed;
      for (int32_t& id : other) id = (id + 1) % static_cast<int32_t>(model->info().num_experts);
      const ForwardRun changed = forward(*model, ids, other);
      EXPECT_EQ(changed.routed, other) << family << " " << backend;
      EXPECT_NE(changed.logits, free_run.logits) << family << " " << backend;
    }
  }
}

TEST(Replay, GenerateReplaysItsOwnRoutingThroughTheCli) {
  TempDir tmp;
  const std::string dir = family_dir("qwen2_moe");
  const CommandResult first = run_r3("generate -q --json --ignore-eos --model " + dir +
                                     " --ids 3,14,15,92,65 --max-new-tokens 6");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::ofstream(tmp.path("routing.json")) << first.out;
  for (const std::string backend : {"modular", "monolithic", "mega"}) {
    const CommandResult again = run_r3("generate -q --json --ignore-eos --model " + dir + " --moe-path " + backend +
                                       " --ids 3,14,15,92,65 --max-new-tokens 6 --replay " + tmp.path("routing.json"));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(nlohmann::json::parse(again.out), nlohmann::json::parse(first.out)) << backend;
  }
}

TEST(Replay, ForwardReplaysADumpBitForBit) {
  TempDir tmp;
  const std::string model = " --model " + family_dir("mixtral") + " --ids 4,8,15,16,23,42";
  ASSERT_EQ(run_r3("forward -q" + model + " --dump " + tmp.path("a.safetensors")).exit_code, 0);
  const CommandResult r = run_r3("forward -q" + model + " --replay " + tmp.path("a.safetensors") + " --dump " +
                                 tmp.path("b.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto a = SafetensorsFile::open(tmp.path("a.safetensors")), b = SafetensorsFile::open(tmp.path("b.safetensors"));
  for (const std::string name : {"logits", "topk_ids", "topk_weights"}) {
    EXPECT_EQ(read_as_f64(*a, name), read_as_f64(*b, name)) << name;
  }
}

TEST(Replay, BadRoutingFilesAreClearErrors) {
  TempDir tmp;
  auto write = [&](const std::string& name, const nlohmann::json& j) {
    std::ofstream(tmp.path(name)) << j.dump();
    return tmp.path(name);
  };
  auto error_of = [&](const std::string& path) -> std::string {
    try {
      engine::load_routing_replay(path, 3, 2, 8);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const nlohmann::json row = {{0, 1}, {2, 3}, {4, 5}};
  EXPECT_EQ(error_of(write("ok.json", {row, row})), "");
  EXPECT_EQ(engine::load_routing_replay(write("obj.json", {{"routed_experts", {row}}}), 3, 2, 8).rows, 1);
  EXPECT_NE(error_of(write("layers.json", {{{0, 1}, {2, 3}}})).find("2 MoE layers, the model has 3"), std::string::npos);
  EXPECT_NE(error_of(write("topk.json", {{{0, 1, 2}, {2, 3, 4}, {4, 5, 6}}})).find("top-3, the model routes top-2"),
            std::string::npos);
  EXPECT_NE(error_of(write("range.json", {{{0, 8}, {2, 3}, {4, 5}}})).find("expert id 8 outside [0, 8)"),
            std::string::npos);
  EXPECT_NE(error_of(write("dup.json", {{{1, 1}, {2, 3}, {4, 5}}})).find("expert 1 appears twice"), std::string::npos);
  EXPECT_NE(error_of(write("ragged.json", {row, {{0, 1}}})).find("row 1 has 1 MoE layers"), std::string::npos);
  EXPECT_NE(error_of(write("empty.json", nlohmann::json::array())).find("non-empty"), std::string::npos);
  std::ofstream(tmp.path("bad.json")) << "[[[0, 1]";
  EXPECT_NE(error_of(tmp.path("bad.json")).find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of(tmp.path("missing.json")).find("cannot read"), std::string::npos);

  // Through the CLI: too few rows for the prompt.
  const CommandResult r = run_r3("generate --model " + family_dir("qwen3_moe") + " --ids 1,2,3 --max-new-tokens 4 --replay " +
                                 tmp.path("ok.json"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("the replayed routing has 2 rows, fewer than the 3 prompt tokens"), std::string::npos) << r.err;
}

// Ids are checked in their widest form: narrowed to int32 first, 4294967300 would become expert 4.
TEST(Replay, ExpertIdsAreRangeCheckedBeforeNarrowing) {
  TempDir tmp;
  auto error_of = [&](const std::string& name, const std::string& text) -> std::string {
    std::ofstream(tmp.path(name)) << text;
    try {
      engine::load_routing_replay(tmp.path(name), 3, 2, 8);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string ok_row = "[[0, 1], [2, 3], [4, 5]]";
  std::string long_string(5002, 'x');  // a 5000-character JSON string
  long_string.front() = long_string.back() = '"';
  // Each wraps to a valid id (4, 4, -1 -> caught but misreported, and a float) when narrowed first.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"4294967300", "expert id 4294967300 outside [0, 8)"},
      {"-4294967292", "expert id -4294967292 outside [0, 8)"},
      {"18446744073709551615", "expert id 18446744073709551615 outside [0, 8)"},
      {"100000000000000000000000", "is not an integer expert id"},
      {"2.5", "2.5 is not an integer expert id"},
      {long_string, "is not an integer expert id"},
  };
  for (const auto& [value, expected] : cases) {
    const std::string text = "[" + ok_row + ", [[0, 1], [2, 3], [4, " + value + "]]]";
    const std::string err = error_of("big.json", text);
    EXPECT_NE(err.find(tmp.path("big.json") + ": row 1 MoE layer 2: "), std::string::npos) << value << ": " << err;
    EXPECT_NE(err.find(expected), std::string::npos) << value << ": " << err;
    EXPECT_LT(err.size(), 300u) << "values are shortened in messages";
  }
  // The same id inside the JSON object `r3 generate --json` writes.
  EXPECT_NE(error_of("obj.json", "{\"routed_experts\": [[[0, 1], [2, 3], [4294967300, 5]]]}")
                .find("row 0 MoE layer 2: expert id 4294967300 outside [0, 8)"),
            std::string::npos);

  // safetensors, I64 and I32: the message names row, layer and the stored value.
  auto st_error = [&](const Tensor& ids) -> std::string {
    write_safetensors(tmp.path("r.safetensors"), {{"topk_ids", ids}}, {});
    try {
      engine::load_routing_replay(tmp.path("r.safetensors"), 3, 2, 8);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::vector<int64_t> wide = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  EXPECT_EQ(st_error(Tensor::from(wide, {2, 3, 2})), "");
  wide[11] = 4294967300;  // row 1, layer 2, sequence 1
  const std::string err = st_error(Tensor::from(wide, {2, 3, 2}));
  EXPECT_NE(err.find("r.safetensors: row 1 MoE layer 2: expert id 4294967300 outside [0, 8)"), std::string::npos)
      << err;
  wide[11] = -4294967292;
  EXPECT_NE(st_error(Tensor::from(wide, {2, 3, 2})).find("row 1 MoE layer 2: expert id -4294967292 outside [0, 8)"),
            std::string::npos);
  std::vector<int32_t> narrow = {0, 1, 2, 3, 4, 5, 0, 1, 2, -7, 4, 5};
  EXPECT_NE(st_error(Tensor::from(narrow, {2, 3, 2})).find("row 1 MoE layer 1: expert id -7 outside [0, 8)"),
            std::string::npos);
}

// A run that stopped at EOS has prompt + generated - 1 rows; replaying its --json output reruns it
// exactly (it stops at the same EOS, so it never needs the rows it does not have).
TEST(Replay, EosStoppedRunReplaysExactly) {
  TempDir tmp;
  const EosModel m = make_eos_model(tmp, "qwen3_moe", "17,42,7,99", 8);
  const CommandResult run = run_r3("generate -q --json --model " + m.dir + " --ids 17,42,7,99 --max-new-tokens 8");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(nlohmann::json::parse(run.out).at("output_ids").size(), m.eos_index + 1);
  std::ofstream(tmp.path("run.json")) << run.out;
  for (const std::string backend : {"modular", "monolithic", "mega"}) {
    const CommandResult again = run_r3("generate -q --json --model " + m.dir + " --moe-path " + backend +
                                       " --ids 17,42,7,99 --max-new-tokens 8 --replay " + tmp.path("run.json"));
    ASSERT_EQ(again.exit_code, 0) << backend << ": " << again.err;
    EXPECT_EQ(nlohmann::json::parse(again.out), nlohmann::json::parse(run.out)) << backend;
  }
  // The routed_experts list alone (no prompt_ids / output_ids to check against) replays too.
  std::ofstream(tmp.path("rows.json")) << nlohmann::json::parse(run.out).at("routed_experts").dump();
  const CommandResult rows_only = run_r3("generate -q --json --model " + m.dir +
                                         " --ids 17,42,7,99 --max-new-tokens 8 --replay " + tmp.path("rows.json"));
  ASSERT_EQ(rows_only.exit_code, 0) << rows_only.err;
  EXPECT_EQ(nlohmann::json::parse(rows_only.out), nlohmann::json::parse(run.out));

  // With --ignore-eos the run goes on past the last replayed row: a clear error when it gets there.
  const CommandResult past = run_r3("generate -q --json --ignore-eos --model " + m.dir +
                                    " --ids 17,42,7,99 --max-new-tokens 8 --replay " + tmp.path("run.json"));
  EXPECT_EQ(past.exit_code, 1);
  EXPECT_EQ(past.out, "");
  const std::string rows = std::to_string(4 + m.eos_index);
  EXPECT_NE(past.err.find("generation went past the replayed routing: token " + rows + " needs row " + rows +
                          ", the replay has " + rows + " rows"),
            std::string::npos) << past.err;
}

TEST(Replay, MoreRowsThanTheRunCanUseAreRefusedUpFront) {
  TempDir tmp;
  const CommandResult run = run_r3("generate -q --json --ignore-eos --model " + family_dir("qwen3_moe") +
                                   " --ids 17,42,7,99 --max-new-tokens 6");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ofstream(tmp.path("run.json")) << nlohmann::json::parse(run.out).at("routed_experts").dump();
  // 9 rows; 4 prompt tokens and 6 new tokens use 4 + 6 - 1 = 9, with 5 new tokens only 8.
  const std::string args = "generate --json --model " + family_dir("qwen3_moe") + " --ids 17,42,7,99 --replay " +
                           tmp.path("run.json") + " --max-new-tokens ";
  EXPECT_EQ(run_r3(args + "6").exit_code, 0);
  const CommandResult r = run_r3(args + "5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the replayed routing has 9 rows, more than the 8 that 4 prompt tokens and 5 new tokens can "
                       "use (prompt + max-new-tokens - 1)"),
            std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("prefill"), std::string::npos) << "refused before computing: " << r.err;
}

// The JSON object `r3 generate --json` writes says which tokens its rows belong to.
TEST(Replay, JsonObjectMustMatchThePromptAndItsOwnOutput) {
  TempDir tmp;
  const std::string model = " --model " + family_dir("qwen3_moe");
  const CommandResult run = run_r3("generate -q --json --ignore-eos" + model + " --ids 17,42,7,99 --max-new-tokens 4");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto object = nlohmann::json::parse(run.out);
  auto write = [&](const std::string& name, const nlohmann::json& j) {
    std::ofstream(tmp.path(name)) << j.dump();
    return tmp.path(name);
  };
  const std::string good = write("good.json", object);
  const std::string gen = "generate --json --max-new-tokens 4" + model + " --replay ";

  // Other prompt ids than --ids.
  CommandResult r = run_r3(gen + good + " --ids 17,42,7,98");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(good + ": prompt_ids 17,42,7,99 differ from --ids 17,42,7,98"), std::string::npos) << r.err;
  r = run_r3(gen + good + " --ids 17,42,7");
  EXPECT_NE(r.err.find(good + ": prompt_ids 17,42,7,99 differ from --ids 17,42,7"), std::string::npos) << r.err;
  // Long lists are shortened in the message.
  nlohmann::json long_prompt = object;
  long_prompt["prompt_ids"] = std::vector<int>(5000, 1);
  long_prompt.erase("output_ids");
  r = run_r3(gen + write("long.json", long_prompt) + " --ids 17,42,7,99");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompt_ids 1,1,1,1,1,1,1,1,... (5000 ids) differ from --ids 17,42,7,99"), std::string::npos)
      << r.err.substr(0, 500);
  EXPECT_LT(r.err.size(), 400u);

  // Rows that do not match prompt_ids + output_ids - 1.
  nlohmann::json short_output = object;
  short_output["output_ids"].erase(short_output["output_ids"].size() - 1);
  r = run_r3(gen + write("short.json", short_output) + " --ids 17,42,7,99");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("short.json: 7 rows of routed_experts, but 4 prompt_ids and 3 output_ids make 6 "
                       "(prompt + output - 1)"),
            std::string::npos) << r.err;
  // prompt_ids or output_ids that are not token-id lists.
  nlohmann::json bad_ids = object;
  bad_ids["output_ids"] = {1, "two"};
  r = run_r3(gen + write("bad_ids.json", bad_ids) + " --ids 17,42,7,99");
  EXPECT_NE(r.err.find("bad_ids.json: output_ids must be a non-empty list of token ids"), std::string::npos) << r.err;

  // The matching object replays; forward accepts any prefix of the tokens the rows belong to.
  EXPECT_EQ(run_r3(gen + good + " --ids 17,42,7,99").exit_code, 0);
  std::vector<int64_t> inputs = object.at("prompt_ids").get<std::vector<int64_t>>();
  const auto output = object.at("output_ids").get<std::vector<int64_t>>();
  inputs.insert(inputs.end(), output.begin(), output.end() - 1);
  const std::string all = join(inputs);
  EXPECT_EQ(run_r3("forward" + model + " --replay " + good + " --ids " + all).exit_code, 0);
  EXPECT_EQ(run_r3("forward" + model + " --replay " + good + " --ids 17,42").exit_code, 0);
  r = run_r3("forward" + model + " --replay " + good + " --ids 17,43");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(good + ": --ids 17,43 are not the tokens the routing was recorded for (17,42,7,99,"),
            std::string::npos) << r.err;
}

}  // namespace
}  // namespace r3::test
