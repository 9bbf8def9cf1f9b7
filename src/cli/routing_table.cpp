#include "cli/routing_table.h"

#include <fmt/format.h>

namespace r3::cli {

std::string format_routing(const engine::RoutedExperts& routed, const std::vector<int64_t>& moe_layers,
                           const std::vector<int32_t>& inputs) {
  std::string out = fmt::format("routed experts: {} rows x {} MoE layers (layers {}) x top-{}\n",
                                routed.rows(), routed.num_moe_layers(), fmt::join(moe_layers, ","),
                                routed.top_k());
  out += fmt::format("{:>5} {:>7} |", "pos", "input");
  for (int64_t layer : moe_layers) out += fmt::format(" L{:<{}}|", layer, 4 * routed.top_k() - 1);
  out += '\n';
  for (int64_t r = 0; r < routed.rows(); ++r) {
    out += fmt::format("{:>5} {:>7} |", r, inputs.at(static_cast<std::size_t>(r)));
    for (int64_t j = 0; j < routed.num_moe_layers(); ++j) {
      for (int64_t k = 0; k < routed.top_k(); ++k) out += fmt::format(" {:>3}", routed.at(r, j, k));
      out += " |";
    }
    out += '\n';
  }
  return out;
}

}  // namespace r3::cli
