// `r3 eplb-plan`: the placement EPLB would choose for given expert loads, and its balance.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/option_checks.h"
#include "core/check.h"
#include "io/expert_load_file.h"
#include "moe/eplb/eplb_controller.h"
#include "moe/expert_placement.h"
#include "moe/eplb/rebalance.h"

namespace r3::cli {

namespace {

struct EplbPlanOptions {
  std::string load_file;
  int64_t redundant = 0;
  moe::EplbTopology topology;
  bool json = false;
};

int run_eplb_plan(const EplbPlanOptions& options) {
  const auto layers = read_expert_loads(options.load_file);
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto& load = layers[l];
    const auto experts = static_cast<int64_t>(load.size());
    R3_CHECK(options.redundant <= moe::kMaxReplicaFactor * experts, "--redundant-experts must be at most ",
             moe::kMaxReplicaFactor, " x the ", experts, " experts of the load file (", moe::kMaxReplicaFactor * experts,
             "), got ", options.redundant);
    const int64_t physical = experts + options.redundant;
    const moe::EplbPlan plan = moe::plan_placement(load, physical, options.topology);
    const auto before = moe::placement_balance(
        moe::ExpertPlacement::initial(experts, options.redundant).physical_to_logical(), load,
        options.topology.num_gpus);
    const auto after = moe::placement_balance(plan.physical_to_logical, load, options.topology.num_gpus);
    if (options.json) {
      out.push_back({{"layer", l},
                     {"physical_to_logical", plan.physical_to_logical},
                     {"replica_count", plan.replica_count},
                     {"gpu_load", after.gpu_load},
                     {"imbalance_before", before.imbalance()},
                     {"imbalance_after", after.imbalance()}});
      continue;
    }
    fmt::print("layer {}: {} experts on {} physical experts, {} GPUs ({} per GPU), {} nodes, {} groups\n", l,
               experts, physical, options.topology.num_gpus, physical / options.topology.num_gpus,
               options.topology.num_nodes, options.topology.num_groups);
    fmt::print("  max/mean GPU load: {:.3f} (initial placement) -> {:.3f} (plan)\n", before.imbalance(),
               after.imbalance());
    const int64_t per_gpu = physical / options.topology.num_gpus;
    for (int64_t g = 0; g < options.topology.num_gpus; ++g) {
      std::vector<int32_t> held(plan.physical_to_logical.begin() + g * per_gpu,
                                plan.physical_to_logical.begin() + (g + 1) * per_gpu);
      fmt::print("  gpu {:>3}: load {:>10.1f}  experts {}\n", g, after.gpu_load[static_cast<std::size_t>(g)],
                 fmt::join(held, " "));
    }
  }
  if (options.json) fmt::print("{}\n", out.dump());
  return 0;
}

}  // namespace

Command add_eplb_plan_command(CLI::App& app) {
  auto options = std::make_shared<EplbPlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "eplb-plan", "Print the expert placement EPLB plans for measured loads, and its balance");
  cmd->add_option("--load", options->load_file,
                  "JSON file: per-expert loads, a list per MoE layer, or {\"load\": ...}")
      ->required();
  cmd->add_option("--redundant-experts", options->redundant, "Extra physical replicas")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  cmd->add_option("--groups", options->topology.num_groups, "Expert groups kept on one node")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_option("--nodes", options->topology.num_nodes, "Nodes")->capture_default_str()->check(at_least<int64_t>(1));
  cmd->add_option("--gpus", options->topology.num_gpus, "GPUs in total")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_flag("--json", options->json, "Print the plans as JSON");
  return [options] { return run_eplb_plan(*options); };
}

}  // namespace r3::cli
