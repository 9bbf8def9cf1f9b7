#include "engine/routing_replay.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/json_file.h"
#include "io/safetensors.h"

namespace r3::engine {

std::vector<int32_t> RoutingReplay::slice(int64_t first, int64_t count) const {
  R3_CHECK(first >= 0 && first + count <= rows, "replay: rows [", first, ", ", first + count,
           ") needed, the replayed routing has ", rows);
  const int64_t per_row = layers * top_k;
  return {ids.begin() + first * per_row, ids.begin() + (first + count) * per_row};
}

namespace {

RoutingReplay from_json(const std::string& path) {
  nlohmann::json j = read_json_file(path);
  if (j.is_object()) {
    R3_CHECK(j.contains("routed_experts"), path, ": JSON object without 'routed_experts'");
    j = j["routed_experts"];
  }
  R3_CHECK(j.is_array() && !j.empty(), path, ": expected a non-empty list [rows][MoE layers][top_k]");
  RoutingReplay r;
  r.rows = static_cast<int64_t>(j.size());
  for (std::size_t t = 0; t < j.size(); ++t) {
    R3_CHECK(j[t].is_array(), path, ": row ", t, " is not a list of MoE layers");
    if (t == 0) r.layers = static_cast<int64_t>(j[t].size());
    R3_CHECK(static_cast<int64_t>(j[t].size()) == r.layers, path, ": row ", t, " has ", j[t].size(),
             " MoE layers, row 0 has ", r.layers);
    for (std::size_t l = 0; l < j[t].size(); ++l) {
      const auto& slots = j[t][l];
      R3_CHECK(slots.is_array(), path, ": row ", t, " layer ", l, " is not a list of expert ids");
      if (t == 0 && l == 0) r.top_k = static_cast<int64_t>(slots.size());
      R3_CHECK(static_cast<int64_t>(slots.size()) == r.top_k, path, ": row ", t, " layer ", l, " has ",
               slots.size(), " ids, expected ", r.top_k);
      for (const auto& id : slots) {
        R3_CHECK(id.is_number_integer(), path, ": row ", t, " layer ", l, ": ", id.dump(),
                 " is not an expert id");
        r.ids.push_back(id.get<int32_t>());
      }
    }
  }
  return r;
}

RoutingReplay from_safetensors(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  const SafetensorsEntry* e = file->find("topk_ids");
  R3_CHECK(e != nullptr, path, ": no 'topk_ids' tensor");
  R3_CHECK(e->shape.size() == 3, path, ": topk_ids must be [rows, MoE layers, top_k], found ",
           shape_to_string(e->shape));
  R3_CHECK(e->dtype == DType::I32 || e->dtype == DType::I64, path, ": topk_ids must be I32 or I64");
  RoutingReplay r{e->shape[0], e->shape[1], e->shape[2], {}};
  Tensor t = file->view("topk_ids");
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (e->dtype == DType::I32) {
      int32_t v;
      std::memcpy(&v, bytes + 4 * i, 4);
      r.ids.push_back(v);
    } else {
      int64_t v;
      std::memcpy(&v, bytes + 8 * i, 8);
      R3_CHECK(v >= INT32_MIN && v <= INT32_MAX, path, ": expert id ", v, " out of range");
      r.ids.push_back(static_cast<int32_t>(v));
    }
  }
  return r;
}

}  // namespace

RoutingReplay load_routing_replay(const std::string& path, int64_t num_moe_layers, int64_t top_k,
                                  int64_t num_experts) {
  const bool is_safetensors = path.size() >= 12 && path.substr(path.size() - 12) == ".safetensors";
  RoutingReplay r = is_safetensors ? from_safetensors(path) : from_json(path);
  R3_CHECK(r.layers == num_moe_layers, path, ": the routing has ", r.layers,
           " MoE layers, the model has ", num_moe_layers);
  R3_CHECK(r.top_k == top_k, path, ": the routing has top-", r.top_k, ", the model routes top-", top_k);
  for (int64_t row = 0; row < r.rows; ++row) {
    for (int64_t l = 0; l < r.layers; ++l) {
      const auto first = r.ids.begin() + (row * r.layers + l) * r.top_k;
      for (int64_t k = 0; k < r.top_k; ++k) {
        const int32_t id = first[k];
        R3_CHECK(id >= 0 && id < num_experts, path, ": row ", row, " MoE layer ", l, ": expert id ",
                 id, " outside [0, ", num_experts, ")");
        R3_CHECK(std::count(first, first + r.top_k, id) == 1, path, ": row ", row, " MoE layer ", l,
                 ": expert ", id, " appears twice");
      }
    }
  }
  return r;
}

}  // namespace r3::engine
