// `r3 generate`: incremental decoding through the KV cache, returning the routed experts of
// every input token.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/option_checks.h"
#include "cli/routing_table.h"
#include "cli/token_ids.h"
#include "engine/generator.h"

namespace r3::cli {

namespace {

struct GenerateCommandOptions {
  ModelOptions model;
  std::string ids;
  engine::GenerateOptions generate;
  bool ignore_eos = false;
  bool json = false;
  std::string replay;
};

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

int run_generate(GenerateCommandOptions& options) {
  const std::vector<int32_t> prompt = parse_token_ids(options.ids);
  options.generate.sampling.validate();
  auto model = options.model.load();
  auto ctx = options.model.make_context();
  const auto& info = model->info();
  // Checked here with the options' names; the engine checks again with its own.
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t max_new = options.generate.max_new_tokens;
  R3_CHECK(info.max_position_embeddings <= 0 || max_new <= info.max_position_embeddings - prompt_len,
           "--ids has ", prompt_len, " tokens and --max-new-tokens is ", max_new, ": more than the model's ",
           "max_position_embeddings of ", info.max_position_embeddings, " positions");
  if (!options.ignore_eos) options.generate.stop_token_ids = info.eos_token_ids;
  engine::RoutingReplay replay;
  if (!options.replay.empty()) {
    replay = engine::load_routing_replay(options.replay, static_cast<int64_t>(info.moe_layers.size()),
                                         info.top_k, info.num_experts);
    replay.check_prompt(prompt);
    options.generate.replay = &replay;
  }

  const engine::GenerateResult result = engine::generate(*model, *ctx, prompt, options.generate);
  const auto& t = result.timings;
  spdlog::info("prefill {} tokens in {:.2f} ms ({:.0f} tokens/s); decode {} steps in {:.2f} ms "
               "({:.0f} tokens/s); {} threads",
               t.prefill_tokens, 1e3 * t.prefill_seconds,
               static_cast<double>(t.prefill_tokens) / t.prefill_seconds, t.decode_steps,
               1e3 * t.decode_seconds,
               t.decode_steps ? static_cast<double>(t.decode_steps) / t.decode_seconds : 0.0,
               ctx->threads().size());

  if (options.json) {
    nlohmann::json out = {{"prompt_ids", result.prompt_ids},
                          {"output_ids", result.output_ids},
                          {"moe_layers", info.moe_layers},
                          {"num_experts", info.num_experts},
                          {"top_k", info.top_k},
                          {"routed_experts", routed_to_json(result.routed_experts)}};
    fmt::print("{}\n", out.dump());
    return 0;
  }
  std::vector<int32_t> inputs = result.prompt_ids;
  inputs.insert(inputs.end(), result.output_ids.begin(), result.output_ids.end());
  fmt::print("prompt ids: {}\n", join_ids(result.prompt_ids, " "));
  fmt::print("output ids: {}\n", join_ids(result.output_ids, " "));
  fmt::print("{}", format_routing(result.routed_experts, info.moe_layers, inputs));
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate tokens from a prompt of token ids and return the routed experts");
  options->model.add_to(*cmd);
  auto& g = options->generate;
  cmd->add_option("--ids", options->ids, "Comma-separated prompt token ids, e.g. 3,17,42")->required();
  cmd->add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_option("--temperature", g.sampling.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str()
      ->check(at_least(0.0));
  cmd->add_option("--top-p", g.sampling.top_p, "Nucleus sampling mass in (0, 1]")
      ->capture_default_str()
      ->check(in_open_closed(0.0, 1.0));
  cmd->add_option("--top-k", g.sampling.top_k, "Sample among the k most likely tokens; 0 = all")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  cmd->add_option("--seed", g.sampling.seed, "Random seed for sampling")->capture_default_str();
  cmd->add_option("--replay", options->replay,
                  "Force this routing, row i while token i is the input (the routed_experts layout "
                  "of --json, or a safetensors file with topk_ids); expert weights come from the "
                  "router's own scores at those ids");
  cmd->add_flag("--ignore-eos", options->ignore_eos,
                "Keep generating past the model's eos_token_id");
  cmd->add_flag("--json", options->json,
                "Print one JSON object: prompt_ids, output_ids, moe_layers, routed_experts "
                "[prompt+generated-1][L_moe][top_k]");
  return [options] { return run_generate(*options); };
}

}  // namespace r3::cli
