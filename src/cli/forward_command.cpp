// `r3 forward`: one prefill over the given ids; optionally dumps logits and routing.
#include <chrono>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/routing_table.h"
#include "cli/token_ids.h"
#include "engine/finite_logits.h"
#include "engine/sampler.h"
#include "engine/routing_replay.h"
#include "engine/step_runner.h"
#include "io/safetensors.h"

namespace r3::cli {

namespace {

struct ForwardOptions {
  ModelOptions model;
  std::string ids;
  std::string dump;
  std::string replay;
};

std::string join_layers(const std::vector<int64_t>& layers) {
  return fmt::format("{}", fmt::join(layers, ","));
}

int run_forward(const ForwardOptions& options) {
  const std::vector<int32_t> ids = parse_token_ids(options.ids);
  auto ctx = options.model.make_context();
  auto model = options.model.load(*ctx);
  const auto& info = model->info();
  const auto tokens = static_cast<int64_t>(ids.size());

  const auto layers = static_cast<int64_t>(info.moe_layers.size()), k = info.top_k;
  std::vector<int32_t> forced;
  if (!options.replay.empty()) {
    const engine::RoutingReplay replay = engine::load_routing_replay(options.replay, layers, k, info.num_experts);
    replay.check_inputs(ids);
    forced = replay.slice(0, tokens);
  }
  R3_CHECK(model->info().max_position_embeddings <= 0 || tokens <= model->info().max_position_embeddings,
           "--ids has ", tokens, " tokens, more than the model's max_position_embeddings of ",
           model->info().max_position_embeddings);
  auto cache = model->make_cache(1, tokens);
  engine::StepRunner runner(*model, *ctx, *cache, tokens, /*keep_weights=*/true);
  engine::RoutedExperts routed(layers, k);
  const auto start = std::chrono::steady_clock::now();
  Tensor logits = runner.run({{0, ids, &routed, forced}}, 0, /*all_logits=*/true);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  engine::check_finite_logits(logits, 0);
  spdlog::info("prefill {} tokens in {:.2f} ms ({:.0f} tokens/s, {} threads)", tokens, ms,
               1e3 * static_cast<double>(tokens) / ms, ctx->threads().size());

  if (!options.dump.empty()) {
    Tensor weights = Tensor::empty(DType::F32, {tokens, layers, k});
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t l = 0; l < layers; ++l) {
        for (int64_t j = 0; j < k; ++j) {
          weights.data<float>()[(t * layers + l) * k + j] = runner.capturer().weight(t, l, j);
        }
      }
    }
    write_safetensors(options.dump,
                      {{"logits", logits},
                       {"topk_ids", Tensor::from(routed.flat(), {tokens, layers, k})},
                       {"topk_weights", weights}},
                      {{"moe_layers", join_layers(info.moe_layers)},
                       {"model_type", info.family},
                       {"input_ids", join_ids(ids)}});
    spdlog::info("wrote {}", options.dump);
  }

  std::vector<int32_t> next;
  for (int64_t t = 0; t < tokens; ++t) {
    next.push_back(engine::argmax(std::span<const float>(
        logits.data<float>() + t * info.vocab_size, static_cast<std::size_t>(info.vocab_size))));
  }
  fmt::print("input ids:          {}\n", join_ids(ids, " "));
  fmt::print("argmax next tokens: {}\n", join_ids(next, " "));
  fmt::print("{}", format_routing(routed, info.moe_layers, ids));
  return 0;
}

}  // namespace

Command add_forward_command(CLI::App& app) {
  auto options = std::make_shared<ForwardOptions>();
  CLI::App* cmd = app.add_subcommand(
      "forward", "One prefill over the given token ids: logits and routed experts of every position");
  options->model.add_to(*cmd);
  cmd->add_option("--ids", options->ids, "Comma-separated input token ids, e.g. 3,17,42")->required();
  cmd->add_option("--replay", options->replay,
                  "Force this routing (JSON routed_experts layout, or safetensors topk_ids) instead "
                  "of the router's own selection");
  cmd->add_option("--dump", options->dump,
                  "Write logits F32 [T,V], topk_ids I32 [T,L_moe,K], topk_weights F32 [T,L_moe,K] "
                  "(metadata moe_layers) to this safetensors file");
  return [options] { return run_forward(*options); };
}

}  // namespace r3::cli
