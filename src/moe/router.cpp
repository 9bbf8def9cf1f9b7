#include "moe/router.h"

#include <algorithm>

namespace r3::moe {

void check_forced_routing(std::span<const int32_t> forced, int64_t tokens, int64_t top_k,
                          int64_t num_experts, int64_t layer_id) {
  R3_CHECK(static_cast<int64_t>(forced.size()) == tokens * top_k, "replayed routing for MoE layer ",
           layer_id, " has ", forced.size(), " ids, expected ", tokens, " tokens x top-", top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    auto row = forced.subspan(static_cast<std::size_t>(t * top_k), static_cast<std::size_t>(top_k));
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t id = row[static_cast<std::size_t>(k)];
      R3_CHECK(id >= 0 && id < num_experts, "replayed routing: expert id ", id, " at token ", t,
               ", MoE layer ", layer_id, " is outside [0, ", num_experts, ")");
      R3_CHECK(std::count(row.begin(), row.end(), id) == 1, "replayed routing: expert ", id,
               " appears twice at token ", t, ", MoE layer ", layer_id);
    }
  }
}

Routing Router::compute(ThreadPool& pool, const Tensor& hidden, std::span<const int32_t> forced) const {
  const int64_t tokens = hidden.dim(0);
  if (!forced.empty()) check_forced_routing(forced, tokens, top_k(), num_experts(), layer_id_);
  Routing out;
  out.resize(tokens, top_k());
  select(pool, hidden, forced, out);
  return out;
}

}  // namespace r3::moe
