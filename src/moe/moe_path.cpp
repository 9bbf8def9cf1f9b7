#include "moe/moe_path.h"

#include "moe/mega_moe.h"
#include "moe/modular_moe.h"
#include "moe/monolithic_moe.h"

namespace r3::moe {

namespace {
constexpr MoePath kAll[] = {MoePath::kModular, MoePath::kMonolithic,
                               MoePath::kMonolithicNoCapture, MoePath::kMega};
}  // namespace

std::string_view moe_path_name(MoePath path) {
  switch (path) {
    case MoePath::kModular: return "modular";
    case MoePath::kMonolithic: return "monolithic";
    case MoePath::kMonolithicNoCapture: return "monolithic-nocapture";
    case MoePath::kMega: return "mega";
  }
  return "?";
}

std::vector<std::string> moe_path_names() {
  std::vector<std::string> names;
  for (MoePath b : kAll) names.emplace_back(moe_path_name(b));
  return names;
}

MoePath parse_moe_path(std::string_view name) {
  for (MoePath b : kAll) {
    if (moe_path_name(b) == name) return b;
  }
  std::string valid;
  for (const auto& n : moe_path_names()) valid += (valid.empty() ? "" : ", ") + n;
  R3_FAIL("unknown MoE path '", name, "' (valid: ", valid, ")");
}

std::unique_ptr<MoeBlock> make_moe_block(MoePath path, int64_t layer_id, Tensor gate_weight,
                                         std::shared_ptr<const RoutingRule> rule,
                                         std::shared_ptr<PhysicalExperts> experts, Tensor gate_bias) {
  auto router = [&] { return std::make_unique<Router>(layer_id, gate_weight, rule, gate_bias); };
  switch (path) {
    case MoePath::kModular:
      return std::make_unique<ModularMoe>(router(), std::move(experts));
    case MoePath::kMega:
      return std::make_unique<MegaMoe>(router(), std::move(experts));
    case MoePath::kMonolithic:
    case MoePath::kMonolithicNoCapture:
      return std::make_unique<MonolithicMoe>(layer_id, gate_weight, rule, std::move(experts),
                                             path == MoePath::kMonolithic, gate_bias);
  }
  R3_FAIL("unknown MoE path");
}

}  // namespace r3::moe
