#include "moe/moe_backend.h"

#include "moe/mega_moe.h"
#include "moe/modular_moe.h"
#include "moe/monolithic_moe.h"

namespace r3::moe {

namespace {
constexpr MoeBackend kAll[] = {MoeBackend::kModular, MoeBackend::kMonolithic,
                               MoeBackend::kMonolithicNoCapture, MoeBackend::kMega};
}  // namespace

std::string_view moe_backend_name(MoeBackend backend) {
  switch (backend) {
    case MoeBackend::kModular: return "modular";
    case MoeBackend::kMonolithic: return "monolithic";
    case MoeBackend::kMonolithicNoCapture: return "monolithic-nocapture";
    case MoeBackend::kMega: return "mega";
  }
  return "?";
}

std::vector<std::string> moe_backend_names() {
  std::vector<std::string> names;
  for (MoeBackend b : kAll) names.emplace_back(moe_backend_name(b));
  return names;
}

MoeBackend parse_moe_backend(std::string_view name) {
  for (MoeBackend b : kAll) {
    if (moe_backend_name(b) == name) return b;
  }
  std::string valid;
  for (const auto& n : moe_backend_names()) valid += (valid.empty() ? "" : ", ") + n;
  R3_FAIL("unknown MoE backend '", name, "' (valid: ", valid, ")");
}

std::unique_ptr<MoeBlock> make_moe_block(MoeBackend backend, int64_t layer_id, Tensor gate_weight,
                                         std::shared_ptr<const RoutingRule> rule,
                                         std::shared_ptr<PhysicalExperts> experts, Tensor gate_bias) {
  auto router = [&] { return std::make_unique<Router>(layer_id, gate_weight, rule, gate_bias); };
  switch (backend) {
    case MoeBackend::kModular:
      return std::make_unique<ModularMoe>(router(), std::move(experts));
    case MoeBackend::kMega:
      return std::make_unique<MegaMoe>(router(), std::move(experts));
    case MoeBackend::kMonolithic:
    case MoeBackend::kMonolithicNoCapture:
      return std::make_unique<MonolithicMoe>(layer_id, gate_weight, rule, std::move(experts),
                                             backend == MoeBackend::kMonolithic, gate_bias);
  }
  R3_FAIL("unknown MoE backend");
}

}  // namespace r3::moe
