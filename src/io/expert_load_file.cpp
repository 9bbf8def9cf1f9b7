#include "io/expert_load_file.h"

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/input_file.h"
#include "io/json_file.h"

namespace r3 {

std::vector<std::vector<double>> read_expert_loads(const std::string& path) {
  nlohmann::json j = read_json_file(path, kMaxLoadBytes, "a load file");
  if (j.is_object() && j.contains("load")) j = j["load"];
  R3_CHECK(j.is_array() && !j.empty(), path, ": expected a list of expert loads or a list of such lists");
  if (!j[0].is_array()) j = nlohmann::json::array({j});
  std::vector<std::vector<double>> layers;
  for (std::size_t l = 0; l < j.size(); ++l) {
    R3_CHECK(j[l].is_array() && !j[l].empty(), path, ": layer ", l, " is not a list of loads");
    std::vector<double> loads;
    for (std::size_t e = 0; e < j[l].size(); ++e) {
      const auto& v = j[l][e];
      R3_CHECK(v.is_number() && v.get<double>() >= 0, path, ": layer ", l, ": load ", e, " (", describe_json(v),
               ") is not a non-negative number");
      loads.push_back(v.get<double>());
    }
    R3_CHECK(layers.empty() || loads.size() == layers[0].size(), path,
             ": layers have different expert counts");
    layers.push_back(std::move(loads));
  }
  return layers;
}

}  // namespace r3
