// `r3 generate`: one or more prompts of token ids through the serving engine, returning the
// generated tokens and the routed experts of every input token.
#include <chrono>
#include <map>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/engine_cli_options.h"
#include "cli/model_options.h"
#include "cli/option_checks.h"
#include "cli/routing_table.h"
#include "cli/token_ids.h"
#include "engine/engine.h"
#include "engine/routing_replay.h"
#include "io/input_file.h"

namespace r3::cli {

namespace {

struct GenerateCommandOptions {
  ModelOptions model;
  EngineCliOptions engine;
  std::vector<std::string> ids;
  std::string ids_file;
  int64_t max_new_tokens = 16;
  engine::SamplingParams sampling;
  bool ignore_eos = false;
  bool json = false;
  std::string replay;
};

// One prompt, and where it came from for messages ("--ids", "prompts.txt:3").
struct Prompt {
  std::vector<int32_t> ids;
  std::string source;
};

std::vector<Prompt> read_prompts(const GenerateCommandOptions& options) {
  std::vector<Prompt> prompts;
  for (const std::string& text : options.ids) prompts.push_back({parse_token_ids(text, "--ids"), "--ids"});
  if (!options.ids_file.empty()) {
    const std::string text = read_input_file(options.ids_file, kMaxPromptsBytes, "a prompts file");
    std::size_t start = 0;
    for (int64_t line = 1; start < text.size(); ++line) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string row = text.substr(start, end - start);
      if (!row.empty() && row.back() == '\r') row.pop_back();
      const std::string source = options.ids_file + ":" + std::to_string(line);
      R3_CHECK(!row.empty(), source, " is empty (one prompt of comma-separated token ids per line)");
      prompts.push_back({parse_token_ids(row, source), source});
      start = end + 1;
    }
    R3_CHECK(!text.empty(), options.ids_file, " holds no prompt");
  }
  R3_CHECK(!prompts.empty(), "give a prompt: --ids 3,17,42 (repeatable) or --ids-file FILE (one prompt per line)");
  return prompts;
}

nlohmann::json routed_to_json(const engine::RoutedExperts& routed) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < routed.rows(); ++r) {
    nlohmann::json layers = nlohmann::json::array();
    for (int64_t j = 0; j < routed.num_moe_layers(); ++j) {
      nlohmann::json choices = nlohmann::json::array();
      for (int64_t k = 0; k < routed.top_k(); ++k) choices.push_back(routed.at(r, j, k));
      layers.push_back(std::move(choices));
    }
    rows.push_back(std::move(layers));
  }
  return rows;
}

struct Generated {
  std::vector<int32_t> output_ids;
  engine::RoutedExperts routed;
};

int run_generate(const GenerateCommandOptions& options) {
  const std::vector<Prompt> prompts = read_prompts(options);
  options.sampling.validate();
  R3_CHECK(options.replay.empty() || prompts.size() == 1, "--replay replays one prompt's routing; ", prompts.size(),
           " prompts were given");
  auto ctx = options.model.make_context();
  const int ranks = options.engine.engine.expert_parallel;
  auto model = options.model.load(*ctx, 0, ranks);
  const auto& info = model->info();
  int64_t longest = 0;
  for (const Prompt& p : prompts) {
    const auto len = static_cast<int64_t>(p.ids.size());
    R3_CHECK(info.max_position_embeddings <= 0 || options.max_new_tokens <= info.max_position_embeddings - len,
             p.source, " has ", len, " tokens and --max-new-tokens is ", options.max_new_tokens, ": more than the model's ",
             "max_position_embeddings of ", info.max_position_embeddings, " positions");
    longest = std::max(longest, len + options.max_new_tokens);
  }
  engine::RoutingReplay replay;
  if (!options.replay.empty()) {
    replay = engine::load_routing_replay(options.replay, static_cast<int64_t>(info.moe_layers.size()), info.top_k,
                                         info.num_experts);
    replay.check_prompt(prompts[0].ids);
    const int64_t usable = static_cast<int64_t>(prompts[0].ids.size()) + options.max_new_tokens - 1;
    R3_CHECK(replay.rows <= usable, replay.path, ": the replayed routing has ", replay.rows, " rows, more than the ",
             usable, " that ", prompts[0].ids.size(), " prompt tokens and ", options.max_new_tokens,
             " new tokens can use (prompt + max-new-tokens - 1)");
  }

  // The engine sized for this run: as many slots as prompts (up to --max-running), the longest
  // request's positions, and a waiting queue that holds every prompt.
  engine::EngineOptions engine_options = options.engine.options();
  auto& sched = engine_options.scheduler;
  sched.max_running = std::min<int64_t>(sched.max_running, static_cast<int64_t>(prompts.size()));
  sched.max_waiting = std::max<int64_t>(sched.max_waiting, static_cast<int64_t>(prompts.size()));
  if (engine_options.max_model_len == 0) engine_options.max_model_len = longest;
  engine::Engine engine(*model, *ctx, engine_options, options.model.rank_placer(ranks));

  std::vector<engine::RequestId> ids;
  for (const Prompt& p : prompts) {
    engine::RequestParams request;
    request.prompt = p.ids;
    request.sampling = options.sampling;
    request.max_new_tokens = options.max_new_tokens;
    request.ignore_eos = options.ignore_eos;
    request.return_routed_experts = true;
    if (!options.replay.empty()) request.forced_routing = replay.ids;
    ids.push_back(engine.submit(std::move(request)));
  }
  std::map<engine::RequestId, Generated> results;
  for (const auto id : ids) results.emplace(id, Generated{{}, engine::RoutedExperts(static_cast<int64_t>(info.moe_layers.size()), info.top_k)});

  // Prefill: the steps until the first token (a long prompt runs in several chunks); decode: the rest.
  const auto start = std::chrono::steady_clock::now();
  double first_token_seconds = 0;
  int64_t steps = 0, prefill_steps = 0;
  while (engine.has_work()) {
    for (const engine::RequestOutput& out : engine.step()) {
      Generated& g = results.at(out.id);
      for (const engine::SampleOutput& s : out.samples) {
        g.output_ids.insert(g.output_ids.end(), s.token_ids.begin(), s.token_ids.end());
        if (s.finish == engine::FinishReason::kAbort) {
          R3_FAIL(!options.replay.empty() && s.abort_message.rfind("generation went past", 0) == 0 ? replay.path + ": " : "",
                  s.abort_message);
        }
        if (s.finish != engine::FinishReason::kNone) g.routed.assign(s.routed_experts);
      }
    }
    ++steps;
    if (prefill_steps == 0 && !results.at(ids.front()).output_ids.empty()) {
      prefill_steps = steps;
      first_token_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    prompt_tokens += static_cast<int64_t>(prompts[i].ids.size());
    output_tokens += static_cast<int64_t>(results.at(ids[i]).output_ids.size());
  }
  if (prompts.size() == 1) {
    const double decode_seconds = seconds - first_token_seconds;
    const int64_t decode_steps = steps - prefill_steps;
    spdlog::info("prefill {} tokens in {:.2f} ms ({:.0f} tokens/s); decode {} steps in {:.2f} ms "
                 "({:.0f} tokens/s); {} threads",
                 prompt_tokens, 1e3 * first_token_seconds, static_cast<double>(prompt_tokens) / first_token_seconds,
                 decode_steps, 1e3 * decode_seconds,
                 decode_steps > 0 ? static_cast<double>(decode_steps) / decode_seconds : 0.0, ctx->threads().size());
  } else {
    const engine::EngineStats stats = engine.stats();
    spdlog::info("{} prompts: {} prompt tokens and {} generated tokens in {:.2f} ms ({:.0f} tokens/s), {} steps "
                 "of up to {} sequences, {} prompt tokens from the prefix cache; {} threads",
                 prompts.size(), prompt_tokens, output_tokens, 1e3 * seconds,
                 static_cast<double>(prompt_tokens + output_tokens) / seconds, stats.steps, stats.max_batch_sequences,
                 stats.prefix_blocks_hit * engine.options().block_size, ctx->threads().size());
  }

  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const Generated& g = results.at(ids[i]);
    const std::vector<int32_t>& prompt = prompts[i].ids;
    if (options.json) {
      const nlohmann::json out = {{"prompt_ids", prompt},
                                  {"output_ids", g.output_ids},
                                  {"moe_layers", info.moe_layers},
                                  {"num_experts", info.num_experts},
                                  {"top_k", info.top_k},
                                  {"routed_experts", routed_to_json(g.routed)}};
      fmt::print("{}\n", out.dump());
      continue;
    }
    if (prompts.size() > 1) fmt::print("{}prompt {} ({}):\n", i == 0 ? "" : "\n", i, prompts[i].source);
    std::vector<int32_t> inputs = prompt;
    inputs.insert(inputs.end(), g.output_ids.begin(), g.output_ids.end());
    fmt::print("prompt ids: {}\n", join_ids(prompt, " "));
    fmt::print("output ids: {}\n", join_ids(g.output_ids, " "));
    fmt::print("{}", format_routing(g.routed, info.moe_layers, inputs));
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate tokens from prompts of token ids and return the routed experts");
  options->model.add_to(*cmd);
  options->engine.add_to(*cmd);
  cmd->add_option("--ids", options->ids,
                  "Comma-separated prompt token ids, e.g. 3,17,42; repeat for several prompts, run together");
  cmd->add_option("--ids-file", options->ids_file, "A file of prompts, one line of comma-separated token ids each");
  cmd->add_option("--max-new-tokens", options->max_new_tokens, "Tokens to generate per prompt")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  auto& sampling = options->sampling;
  cmd->add_option("--temperature", sampling.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str()
      ->check(at_least(0.0));
  cmd->add_option("--top-p", sampling.top_p, "Nucleus sampling mass in (0, 1]")
      ->capture_default_str()
      ->check(in_open_closed(0.0, 1.0));
  cmd->add_option("--top-k", sampling.top_k, "Sample among the k most likely tokens; 0 = all")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  cmd->add_option("--min-p", sampling.min_p, "Drop tokens less likely than min-p x the most likely; 0 = off")
      ->capture_default_str()
      ->check(in_closed(0.0, 1.0));
  cmd->add_option("--seed", sampling.seed, "Random seed for sampling")->capture_default_str();
  cmd->add_option("--replay", options->replay,
                  "Force this routing (one prompt only), row i while token i is the input (the "
                  "routed_experts layout of --json, or a safetensors file with topk_ids); expert "
                  "weights come from the router's own scores at those ids");
  cmd->add_flag("--ignore-eos", options->ignore_eos,
                "Keep generating past the model's eos_token_id");
  cmd->add_flag("--json", options->json,
                "Print one JSON object per prompt, one per line, in input order: prompt_ids, output_ids, "
                "moe_layers, routed_experts [prompt+generated-1][L_moe][top_k]");
  return [options] { return run_generate(*options); };
}

}  // namespace r3::cli
