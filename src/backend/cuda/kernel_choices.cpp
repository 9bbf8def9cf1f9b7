#include "backend/cuda/kernel_choices.h"

#include <array>
#include <utility>

#include "core/check.h"

namespace r3::backend::cuda {

namespace {

constexpr std::array<std::pair<std::string_view, Choice KernelChoices::*>, 4> kTable = {{
    {"cluster_merge", &KernelChoices::cluster_merge},
    {"gate_up_one_wave", &KernelChoices::gate_up_one_wave},
    {"down_rows_in_flight", &KernelChoices::down_rows_in_flight},
    {"down_six_blocks", &KernelChoices::down_six_blocks},
}};

}  // namespace

std::string KernelChoices::names() {
  std::string all;
  for (const auto& [name, field] : kTable) {
    if (!all.empty()) all += ", ";
    all += name;
  }
  return all;
}

void KernelChoices::set(std::string_view name, std::string_view value) {
  Choice KernelChoices::*field = nullptr;
  for (const auto& [known, member] : kTable) {
    if (known == name) field = member;
  }
  R3_CHECK(field != nullptr, "unknown kernel choice '", name, "' (known: ", names(), ")");
  if (value == "rule") this->*field = Choice::kRule;
  else if (value == "always") this->*field = Choice::kAlways;
  else if (value == "never") this->*field = Choice::kNever;
  else R3_FAIL("kernel choice ", name, ": unknown value '", value, "' (known: ", kValues, ")");
}

void KernelChoices::set(std::string_view setting) {
  const std::size_t eq = setting.find('=');
  R3_CHECK(eq != std::string_view::npos, "kernel choice '", setting, "': expected NAME=VALUE (names: ", names(),
           "; values: ", kValues, ")");
  set(setting.substr(0, eq), setting.substr(eq + 1));
}

}  // namespace r3::backend::cuda
