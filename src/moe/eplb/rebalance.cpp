#include "moe/eplb/rebalance.h"

#include <algorithm>
#include <iterator>
#include <numeric>

#include "core/check.h"

namespace r3::moe {

std::pair<std::vector<int32_t>, std::vector<int32_t>> balanced_packing(std::span<const double> weights,
                                                                       int64_t num_packs) {
  const auto n = static_cast<int64_t>(weights.size());
  R3_CHECK(num_packs > 0 && n % num_packs == 0, "balanced packing: ", n, " items do not split into ",
           num_packs, " equal packs");
  const int64_t per_pack = n / num_packs;
  std::vector<int32_t> pack(static_cast<std::size_t>(n)), rank(static_cast<std::size_t>(n));
  if (per_pack == 1) {  // one item per pack: keep the order (as DeepSeek's EPLB does)
    std::iota(pack.begin(), pack.end(), 0);
    return {pack, rank};
  }
  std::vector<int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return weights[a] > weights[b]; });
  std::vector<double> pack_weight(static_cast<std::size_t>(num_packs), 0.0);
  std::vector<int64_t> pack_items(static_cast<std::size_t>(num_packs), 0);
  for (int32_t item : order) {
    int64_t best = -1;
    for (int64_t p = 0; p < num_packs; ++p) {
      if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
    }
    pack[item] = static_cast<int32_t>(best);
    rank[item] = static_cast<int32_t>(pack_items[best]++);
    pack_weight[best] += weights[item];
  }
  return {pack, rank};
}

namespace {

struct Replication {
  std::vector<int32_t> physical_to_logical, rank, count;
};

// Gives the num_physical - n extra physical experts, one at a time, to the expert whose load per replica
// is currently the largest.
Replication replicate_experts(std::span<const double> load, int64_t num_physical) {
  const auto n = static_cast<int64_t>(load.size());
  Replication r;
  r.physical_to_logical.resize(static_cast<std::size_t>(num_physical));
  r.rank.assign(static_cast<std::size_t>(num_physical), 0);
  r.count.assign(static_cast<std::size_t>(n), 1);
  std::iota(r.physical_to_logical.begin(), r.physical_to_logical.begin() + n, 0);
  for (int64_t p = n; p < num_physical; ++p) {
    int64_t best = 0;
    for (int64_t e = 1; e < n; ++e) {
      if (load[e] / r.count[e] > load[best] / r.count[best]) best = e;
    }
    r.physical_to_logical[p] = static_cast<int32_t>(best);
    r.rank[p] = r.count[best]++;
  }
  return r;
}

EplbPlan plan_hierarchical(std::span<const double> load, int64_t num_physical, int64_t groups,
                           int64_t nodes, int64_t gpus) {
  const auto experts = static_cast<int64_t>(load.size());
  const int64_t group_size = experts / groups, groups_per_node = groups / nodes;
  const int64_t per_node_logical = experts / nodes, per_node_physical = num_physical / nodes;
  const int64_t per_gpu = num_physical / gpus, gpus_per_node = gpus / nodes;

  // 1. Groups onto nodes. log2mlog: logical expert -> position in node-major order.
  std::vector<double> group_load(static_cast<std::size_t>(groups), 0.0);
  for (int64_t e = 0; e < experts; ++e) group_load[e / group_size] += load[e];
  auto [group_pack, group_rank] = balanced_packing(group_load, nodes);
  std::vector<int32_t> log2mlog(static_cast<std::size_t>(experts)), mlog2log(static_cast<std::size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t g = e / group_size;
    log2mlog[e] = static_cast<int32_t>((group_pack[g] * groups_per_node + group_rank[g]) * group_size + e % group_size);
    mlog2log[log2mlog[e]] = static_cast<int32_t>(e);
  }

  EplbPlan plan;
  plan.physical_to_logical.resize(static_cast<std::size_t>(num_physical));
  plan.replica_rank.resize(static_cast<std::size_t>(num_physical));
  plan.replica_count.resize(static_cast<std::size_t>(experts));
  for (int64_t node = 0; node < nodes; ++node) {
    // 2. Replicas within the node.
    std::vector<double> node_load(static_cast<std::size_t>(per_node_logical));
    for (int64_t i = 0; i < per_node_logical; ++i) node_load[i] = load[mlog2log[node * per_node_logical + i]];
    const Replication rep = replicate_experts(node_load, per_node_physical);
    // 3. The node's physical experts onto its GPUs.
    std::vector<double> phys_load(static_cast<std::size_t>(per_node_physical));
    for (int64_t i = 0; i < per_node_physical; ++i) {
      const int32_t m = rep.physical_to_logical[i];
      phys_load[i] = node_load[m] / rep.count[m];
    }
    auto [gpu_pack, gpu_rank] = balanced_packing(phys_load, gpus_per_node);
    for (int64_t i = 0; i < per_node_physical; ++i) {
      const int64_t physical = node * per_node_physical + gpu_pack[i] * per_gpu + gpu_rank[i];
      const int32_t mlog = static_cast<int32_t>(node * per_node_logical + rep.physical_to_logical[i]);
      plan.physical_to_logical[physical] = mlog2log[mlog];
      plan.replica_rank[physical] = rep.rank[i];
    }
    for (int64_t i = 0; i < per_node_logical; ++i) {
      plan.replica_count[mlog2log[node * per_node_logical + i]] = rep.count[i];
    }
  }
  return plan;
}

}  // namespace

void validate_topology(const EplbTopology& t, int64_t experts, int64_t num_physical) {
  R3_CHECK(experts > 0, "EPLB: no experts to place");
  R3_CHECK(num_physical >= experts, "EPLB: ", num_physical, " physical experts cannot hold ", experts,
           " experts");
  R3_CHECK(t.num_groups > 0 && t.num_nodes > 0 && t.num_gpus > 0, "EPLB: groups, nodes and GPUs must be positive");
  R3_CHECK(experts % t.num_groups == 0, "EPLB: ", experts, " experts do not split into ", t.num_groups,
           " groups");
  R3_CHECK(t.num_gpus % t.num_nodes == 0, "EPLB: ", t.num_gpus, " GPUs do not split over ", t.num_nodes,
           " nodes");
  R3_CHECK(num_physical % t.num_gpus == 0, "EPLB: ", num_physical, " physical experts do not split over ",
           t.num_gpus, " GPUs (experts + redundant must be a multiple of the GPU count)");
}

EplbPlan plan_placement(std::span<const double> logical_load, int64_t num_physical,
                        const EplbTopology& t) {
  const auto experts = static_cast<int64_t>(logical_load.size());
  validate_topology(t, experts, num_physical);
  for (double l : logical_load) R3_CHECK(l >= 0, "EPLB: negative load ", l);
  if (t.num_groups % t.num_nodes == 0) {
    return plan_hierarchical(logical_load, num_physical, t.num_groups, t.num_nodes, t.num_gpus);
  }
  return plan_hierarchical(logical_load, num_physical, 1, 1, t.num_gpus);
}

namespace {

// How many experts two GPUs' slots have in common, replicas counted: the multisets' intersection.
int64_t shared_experts(std::span<const int32_t> a, std::span<const int32_t> b) {
  std::vector<int32_t> x(a.begin(), a.end()), y(b.begin(), b.end());
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  std::vector<int32_t> both;
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
  return static_cast<int64_t>(both.size());
}

}  // namespace

std::vector<int32_t> keep_in_place(std::span<const int32_t> current, std::vector<int32_t> planned,
                                   const EplbTopology& topology) {
  const auto slots = static_cast<int64_t>(planned.size());
  const int64_t gpus = topology.num_gpus, nodes = topology.num_nodes;
  R3_CHECK(static_cast<int64_t>(current.size()) == slots && gpus > 0 && nodes > 0 && gpus % nodes == 0 &&
               slots % gpus == 0,
           "EPLB: keeping experts in place across ", current.size(), " and ", slots, " slots on ", gpus, " GPUs of ",
           nodes, " nodes");
  const int64_t per_gpu = slots / gpus, per_node = gpus / nodes;
  const auto on_gpu = [&](auto& v, int64_t g) { return std::span(v).subspan(static_cast<std::size_t>(g * per_gpu), static_cast<std::size_t>(per_gpu)); };
  // Planned GPU -> GPU, within each node.
  std::vector<int64_t> gpu_of(static_cast<std::size_t>(gpus), -1);
  for (int64_t node = 0; node < nodes; ++node) {
    const int64_t first = node * per_node;
    std::vector<std::vector<int64_t>> shared(static_cast<std::size_t>(per_node));
    for (int64_t a = 0; a < per_node; ++a) {
      for (int64_t b = 0; b < per_node; ++b) shared[a].push_back(shared_experts(on_gpu(planned, first + a), on_gpu(current, first + b)));
    }
    std::vector<bool> taken(static_cast<std::size_t>(per_node), false);
    for (int64_t round = 0; round < per_node; ++round) {
      int64_t best_a = -1, best_b = -1;
      for (int64_t a = 0; a < per_node; ++a) {
        if (gpu_of[static_cast<std::size_t>(first + a)] >= 0) continue;
        for (int64_t b = 0; b < per_node; ++b) {
          if (!taken[static_cast<std::size_t>(b)] && (best_a < 0 || shared[a][b] > shared[best_a][best_b])) {
            best_a = a;
            best_b = b;
          }
        }
      }
      gpu_of[static_cast<std::size_t>(first + best_a)] = first + best_b;
      taken[static_cast<std::size_t>(best_b)] = true;
    }
  }
  std::vector<int32_t> placed(planned.size());
  for (int64_t a = 0; a < gpus; ++a) {
    const std::span<const int32_t> mine = on_gpu(planned, a);
    const int64_t g = gpu_of[static_cast<std::size_t>(a)];
    const std::span<const int32_t> held = on_gpu(current, g);
    const std::span<int32_t> out = on_gpu(placed, g);
    std::vector<int32_t> pending(mine.begin(), mine.end());
    std::vector<bool> kept(static_cast<std::size_t>(per_gpu), false);
    for (int64_t s = 0; s < per_gpu; ++s) {
      const auto it = std::find(pending.begin(), pending.end(), held[s]);
      if (it == pending.end()) continue;
      out[s] = held[s];
      kept[static_cast<std::size_t>(s)] = true;
      *it = -1;  // taken
    }
    auto next = pending.begin();
    for (int64_t s = 0; s < per_gpu; ++s) {
      if (kept[static_cast<std::size_t>(s)]) continue;
      next = std::find_if(next, pending.end(), [](int32_t e) { return e >= 0; });
      out[s] = *next++;
    }
  }
  return placed;
}

PlacementBalance placement_balance(std::span<const int32_t> physical_to_logical,
                                   std::span<const double> logical_load, int64_t num_gpus) {
  const auto physical = static_cast<int64_t>(physical_to_logical.size());
  R3_CHECK(num_gpus > 0 && physical % num_gpus == 0, "balance: ", physical, " physical experts over ", num_gpus, " GPUs");
  std::vector<int64_t> count(logical_load.size(), 0);
  for (int32_t l : physical_to_logical) ++count.at(static_cast<std::size_t>(l));
  PlacementBalance b;
  b.gpu_load.assign(static_cast<std::size_t>(num_gpus), 0.0);
  for (int64_t p = 0; p < physical; ++p) {
    const int32_t l = physical_to_logical[p];
    b.gpu_load[p / (physical / num_gpus)] += logical_load[l] / static_cast<double>(count[l]);
  }
  b.max = *std::max_element(b.gpu_load.begin(), b.gpu_load.end());
  b.mean = std::accumulate(b.gpu_load.begin(), b.gpu_load.end(), 0.0) / static_cast<double>(num_gpus);
  return b;
}

}  // namespace r3::moe
