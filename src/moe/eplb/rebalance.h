// Expert-parallel load balancing: a new placement from measured loads, with the hierarchical
// algorithm of DeepSeek's EPLB:
//   1. pack expert groups onto nodes so node loads are balanced (groups stay whole),
//   2. within each node, give extra replicas to the experts with the heaviest load per replica,
//   3. pack the node's physical experts onto its GPUs, balancing load per GPU.
// When the groups do not divide evenly over the nodes it balances globally (one group, one node).
// Nodes and GPUs are parameters: on one CPU they only shape the plan.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace r3::moe {

struct EplbTopology {
  int64_t num_groups = 1;  // expert groups (DeepSeek n_group); experts of a group share a node
  int64_t num_nodes = 1;
  int64_t num_gpus = 1;    // in total, a multiple of num_nodes
};

struct EplbPlan {
  std::vector<int32_t> physical_to_logical;  // [num_physical]; physical expert p sits on GPU p / (P / gpus)
  std::vector<int32_t> replica_rank;         // [num_physical]: which replica of its expert
  std::vector<int32_t> replica_count;        // [num_logical]
};

// Throws r3::Error explaining why, unless plan_placement can place num_experts experts on
// num_physical physical experts over this topology. EplbController checks it at start-up so that a bad
// topology fails before any token runs, with the rules the rebalancer applies later.
void validate_topology(const EplbTopology& topology, int64_t num_experts, int64_t num_physical);

// logical_load[e] >= 0. Throws on shapes the algorithm cannot place (validate_topology).
EplbPlan plan_placement(std::span<const double> logical_load, int64_t num_physical,
                        const EplbTopology& topology);

// `planned` (a plan's physical_to_logical) rearranged so that as many experts as possible stay
// where `current` has them, with the same balance: the balance depends only on which experts each
// GPU holds, not on which GPU of its node that is nor on the slot an expert sits in. An expert that
// stays on its GPU does not cross to another (between expert-parallel ranks, the transfers), and
// one that stays in its slot is not copied at all. First the node's planned GPUs go to its GPUs,
// greedily, the pair sharing the most experts first (ties: lower planned, then lower current GPU);
// then within a GPU, slots keeping their expert keep it and the other experts fill the freed slots
// in the planned order.
std::vector<int32_t> keep_in_place(std::span<const int32_t> current, std::vector<int32_t> planned,
                                   const EplbTopology& topology);

struct PlacementBalance {
  std::vector<double> gpu_load;  // each replica carries load / replica_count of its expert
  double max = 0, mean = 0;
  double imbalance() const { return mean > 0 ? max / mean : 1.0; }  // 1.0 is perfect
};

PlacementBalance placement_balance(std::span<const int32_t> physical_to_logical,
                                   std::span<const double> logical_load, int64_t num_gpus);

// Building blocks, exposed for tests.
// Packs n weighted items into num_packs packs of n / num_packs items each, heaviest item first
// into the lightest pack with room. Returns (pack index, rank within pack) per item.
std::pair<std::vector<int32_t>, std::vector<int32_t>> balanced_packing(std::span<const double> weights,
                                                                       int64_t num_packs);

}  // namespace r3::moe
