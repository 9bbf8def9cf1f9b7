// `r3 bench` on the fixtures: the counts it reports are the run's, the prefix cache and
// preemption show up where the options call for them, and bad sizes are refused up front.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/device_decoder.h"
#include "test_support.h"

namespace r3::test {
namespace {

// The GPU benchmark's batches against the device memory left beside the weights: on an 80 GB
// H100 the bf16 Qwen3-30B-A3B shape (61.1 GB of weights; 81559 MiB on the card) leaves about
// 24 GB, which holds the 1k-position KV cache of 64 sequences (6.5 GB) but not of 256 (26.2 GB).
// Run, that batch would run out of memory there and take the whole run's results with it, so it
// is skipped.
// A 141 GB H200 runs all four.
TEST(SyntheticBench, BatchesWhoseKvCacheDoesNotFitBesideTheWeightsAreSkipped) {
  const models::SyntheticShape shape = models::SyntheticShape::named("qwen3-30b-a3b");
  const int64_t h100 = int64_t{81559} << 20, h200 = int64_t{143771} << 20;
  const std::vector<int64_t> batches = {1, 8, 64, 256};
  const models::BatchesThatFit on_h100 = models::batches_that_fit(shape, batches, 1024, h100 - shape.weight_bytes());
  EXPECT_EQ(on_h100.run, (std::vector<int64_t>{1, 8, 64}));
  EXPECT_EQ(on_h100.skipped, (std::vector<int64_t>{256}));
  const models::BatchesThatFit on_h200 = models::batches_that_fit(shape, batches, 1024, h200 - shape.weight_bytes());
  EXPECT_EQ(on_h200.run, batches);
  EXPECT_TRUE(on_h200.skipped.empty());
  // The KV cache counted: keys and values, bf16, every layer, context + the spare positions.
  EXPECT_EQ(shape.kv_cache_bytes(256, 1024 + models::kSyntheticSparePositions),
            int64_t{48} * 256 * (1024 + 16) * (4 * 128) * 2 * 2);
}

// 12 prompts of 40 tokens, 8 outputs each, in blocks of 4 positions, at most 4 running.
const std::string kBenchSize = " --num-prompts 12 --prompt-len 40 --output-len 8 --block-size 4 --max-running 4";

nlohmann::json bench_json(const std::string& family, const std::string& extra) {
  const CommandResult r = run_r3("bench -q --json --model " + family_dir(family) + kBenchSize + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // -q: no progress line, no log
  return nlohmann::json::parse(r.out);
}

void bench_expect_counts(const nlohmann::json& j) {
  EXPECT_EQ(j.at("requests").get<int>(), 12) << j;
  EXPECT_EQ(j.at("prompt_tokens").get<int>(), 12 * 40) << j;
  EXPECT_EQ(j.at("output_tokens").get<int>(), 12 * 8) << j;  // ignore_eos: every request runs to the end
  EXPECT_GT(j.at("total_tokens_per_second").get<double>(), 0) << j;
  EXPECT_GT(j.at("output_tokens_per_second").get<double>(), 0) << j;
  EXPECT_GT(j.at("max_step_seconds").get<double>(), 0) << j;
  EXPECT_LE(j.at("max_step_seconds").get<double>(), j.at("step_seconds").get<double>()) << j;
  EXPECT_LE(j.at("peak_kv_blocks_in_use").get<int>(), j.at("kv_blocks_total").get<int>()) << j;
  EXPECT_GT(j.at("peak_kv_blocks_in_use").get<int>(), 0) << j;
  EXPECT_LE(j.at("max_sequences_per_step").get<int>(), 4) << j;
  EXPECT_LE(j.at("mean_ttft_seconds").get<double>(), j.at("mean_latency_seconds").get<double>()) << j;
  // Computed plus cached prompt tokens cover every prompt (more when preemption recomputed some).
  EXPECT_GE(j.at("prompt_tokens_computed").get<int>() + j.at("prompt_tokens_cached").get<int>(), 12 * 40) << j;
}

TEST(BenchCommand, SharedPrefixHitsThePrefixCache) {
  const auto j = bench_json("qwen3_moe", " --shared-prefix 0.5");
  bench_expect_counts(j);
  EXPECT_GT(j.at("prefix_hit_rate").get<double>(), 0) << j;
  EXPECT_GT(j.at("prompt_tokens_cached").get<int>(), 0) << j;
  EXPECT_LT(j.at("prompt_tokens_computed").get<int>(), 12 * 40) << j;
  EXPECT_GE(j.at("routed_share").get<double>(), 0) << j;
  EXPECT_LT(j.at("routed_share").get<double>(), 1) << j;
}

TEST(BenchCommand, NoPrefixCachingMeansNoHits) {
  const auto j = bench_json("qwen3_moe", " --shared-prefix 0.5 --no-prefix-caching");
  bench_expect_counts(j);
  EXPECT_EQ(j.at("prefix_hit_rate").get<double>(), 0) << j;
  EXPECT_EQ(j.at("prompt_tokens_cached").get<int>(), 0) << j;
}

// 4 running sequences of 48 positions need 48 blocks of 4; 30 make the scheduler preempt.
TEST(BenchCommand, SmallKvPoolPreempts) {
  const auto j = bench_json("qwen3_moe", " --kv-blocks 30");
  bench_expect_counts(j);
  EXPECT_GT(j.at("preemptions").get<int>(), 0) << j;
  EXPECT_EQ(j.at("kv_blocks_total").get<int>(), 30) << j;
}

// DeepSeek-V4's cache cannot share prefixes: the engine turns caching off and the run goes on.
TEST(BenchCommand, DeepSeekV4RunsWithoutPrefixCaching) {
  const auto j = bench_json("deepseek_v4", " --shared-prefix 0.5");
  bench_expect_counts(j);
  EXPECT_EQ(j.at("prefix_hit_rate").get<double>(), 0) << j;
  EXPECT_EQ(j.at("prompt_tokens_cached").get<int>(), 0) << j;
}

// --ep 2: the same requests over two ranks of at most 4 running sequences each, rows crossing
// between them; one rank sends none.
TEST(BenchCommand, ExpertParallelRanksServeEveryRequest) {
  const auto j = bench_json("qwen3_moe", " --ep 2");
  EXPECT_EQ(j.at("requests").get<int>(), 12) << j;
  EXPECT_EQ(j.at("output_tokens").get<int>(), 12 * 8) << j;
  EXPECT_EQ(j.at("prompt_tokens_computed").get<int>() + j.at("prompt_tokens_cached").get<int>(), 12 * 40) << j;
  EXPECT_GT(j.at("max_sequences_per_step").get<int>(), 4) << j;
  EXPECT_LE(j.at("max_sequences_per_step").get<int>(), 8) << j;
  EXPECT_GT(j.at("expert_rows_exchanged").get<int64_t>(), 0) << j;
  EXPECT_EQ(bench_json("qwen3_moe", "").at("expert_rows_exchanged").get<int64_t>(), 0);
  EXPECT_EQ(j.at("expert_weight_bytes_moved").get<int64_t>(), 0) << j;  // no EPLB
  const CommandResult synthetic = run_r3("bench --synthetic qwen3-30b-a3b --ep 2");
  EXPECT_NE(synthetic.exit_code, 0);
  EXPECT_NE(synthetic.err.find("--ep runs requests through the engine's ranks; --synthetic times whole model steps"),
            std::string::npos) << synthetic.err;
}

TEST(BenchCommand, TextReport) {
  const CommandResult r = run_r3("bench --model " + family_dir("qwen3_moe") + kBenchSize + " --shared-prefix 0.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string line :
       {"requests:              12\n", "prompt tokens:         480\n", "output tokens:         96\n", "prefill:",
        "prefix-hit rate", "wall time:", "tokens/s total", "steps:", "preemptions:", "peak KV blocks in use:",
        "routed-experts share:", "mean time to first token:", "mean request latency:"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  EXPECT_NE(r.err.find("bench: 12 prompts of 40 tokens (20 shared)"), std::string::npos) << r.err;
  EXPECT_NE(run_r3("bench --help").out.find("--shared-prefix"), std::string::npos);
}

TEST(BenchCommand, BadSizesAreRefused) {
  const std::string bench = "bench -q --model " + family_dir("qwen3_moe");
  // The fixture's max_position_embeddings is 256.
  EXPECT_TRUE(refused_with(run_r3(bench + " --prompt-len 200 --output-len 57"),
                           "--prompt-len 200 + --output-len 57 exceeds the model's max_position_embeddings of 256"));
  EXPECT_TRUE(refused_with(run_r3(bench + " --prompt-len 40 --output-len 8 --block-size 4 --kv-blocks 11"),
                           "need 12 KV blocks of --block-size 4, more than the 11 of --kv-blocks"));
  // Range checks of the options themselves are usage errors (exit 2), as for every command.
  for (const auto& [args, expected] : std::vector<std::pair<std::string, std::string>>{
           {" --shared-prefix 1.5", "--shared-prefix: must be a number in [0, 1], got 1.5"},
           {" --shared-prefix -0.1", "--shared-prefix: must be a number in [0, 1], got -0.1"},
           {" --num-prompts 0", "--num-prompts: must be an integer >= 1, got 0"},
           {" --prompt-len 0", "--prompt-len: must be an integer >= 1, got 0"},
           {" --output-len 0", "--output-len: must be an integer >= 1, got 0"},
       }) {
    const CommandResult r = run_r3(bench + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_NE(r.err.find(expected), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  }
}

// The device options say what is wrong before anything loads: a bench needs a model or a
// synthetic shape, a synthetic shape is made on the GPU (through the engine too), the engine mode
// needs a synthetic shape, --dtype is for the GPU's weights, the
// GPU runs every MoE path that captures, and
// --device cuda either runs (a machine with a GPU) or is refused in one line (one without).
TEST(BenchCommand, DeviceOptionsAreCheckedUpFront) {
  EXPECT_TRUE(refused_with(run_r3("bench"), "give --model DIR (or --synthetic NAME with --device cuda)"));
  EXPECT_TRUE(refused_with(run_r3("bench --synthetic qwen3-30b-a3b"), "add --device cuda"));
  EXPECT_TRUE(refused_with(run_r3("bench --synthetic qwen3-30b-a3b --synthetic-engine --ep 2"), "add --device cuda"));
  const CommandResult engine_alone = run_r3("bench --model " + family_dir("qwen3_moe") + " --synthetic-engine");
  EXPECT_NE(engine_alone.exit_code, 0);  // a usage error, from the option parser
  EXPECT_NE(engine_alone.err.find("--synthetic-engine requires --synthetic"), std::string::npos) << engine_alone.err;
  EXPECT_TRUE(refused_with(run_r3("forward --dtype float32 --model " + family_dir("qwen3_moe") + " --ids 1,2"),
                           "--dtype applies to --device cuda"));
  EXPECT_TRUE(refused_with(
      run_r3("forward --device cuda --moe-path monolithic-nocapture --model " + family_dir("qwen3_moe") + " --ids 1,2"),
      "--moe-path monolithic-nocapture: the GPU runs mega, modular or monolithic"));
  const CommandResult gpu = run_r3("forward -q --device cuda --model " + family_dir("qwen3_moe") + " --ids 1,2");
  if (backend::Context::cuda_available()) {
    EXPECT_EQ(gpu.exit_code, 0) << gpu.err;
  } else {
    EXPECT_TRUE(refused_with(gpu, "--device cuda"));
  }
}

// --kernel-choice applies to --device cuda, and its names and values are checked before a device
// is opened (so a machine without a GPU refuses a bad one for what it is).
TEST(BenchCommand, KernelChoicesAreCheckedUpFront) {
  const std::string forward = "forward --model " + family_dir("qwen3_moe") + " --ids 1,2";
  EXPECT_TRUE(refused_with(run_r3(forward + " --kernel-choice cluster_merge=never"),
                           "--kernel-choice applies to --device cuda"));
  EXPECT_TRUE(refused_with(run_r3(forward + " --device cuda --kernel-choice turbo=never"),
                           "unknown kernel choice 'turbo' (known: cluster_merge, gate_up_one_wave, "
                           "down_rows_in_flight, down_six_blocks)"));
  EXPECT_TRUE(refused_with(run_r3(forward + " --device cuda --kernel-choice cluster_merge=on"),
                           "kernel choice cluster_merge: unknown value 'on' (known: rule, always, never)"));
  EXPECT_TRUE(refused_with(run_r3(forward + " --device cuda --kernel-choice cluster_merge"), "expected NAME=VALUE"));
  EXPECT_TRUE(refused_with(
      run_r3("bench --device cuda --synthetic qwen3-30b-a3b --kernel-choice gate_up_one_wave=maybe"),
      "kernel choice gate_up_one_wave: unknown value 'maybe'"));
  EXPECT_NE(run_r3("forward --help").out.find("--kernel-choice"), std::string::npos);
}

// --ep 2 with EPLB rebalancing every 2 steps, a layer a step: every request served, and the
// weights EPLB moved between the two ranks reported.
TEST(BenchCommand, ExpertParallelRebalancesReportTheWeightsTheyMoved) {
  const auto j = bench_json("qwen3_moe",
                            " --ep 2 --eplb-redundant-experts 4 --eplb-window 2 --eplb-rebalance-every 2 "
                            "--eplb-layers-per-step 1");
  EXPECT_EQ(j.at("requests").get<int>(), 12) << j;
  EXPECT_EQ(j.at("output_tokens").get<int>(), 12 * 8) << j;
  EXPECT_GT(j.at("expert_weight_bytes_moved").get<int64_t>(), 0) << j;
}

}  // namespace
}  // namespace r3::test
