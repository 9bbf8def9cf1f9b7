#include "engine/routing_replay.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/checked.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "moe/routing_rule.h"

namespace r3::engine {

namespace {

std::string brief_ids(const std::vector<int32_t>& ids, std::size_t max_ids = 8) {
  std::string out;
  for (std::size_t i = 0; i < ids.size() && i < max_ids; ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  if (ids.size() > max_ids) out += ",... (" + std::to_string(ids.size()) + " ids)";
  return out;
}

// An expert id is range-checked in the type it was stored as, before it is narrowed to int32:
// narrowing first would turn 4294967300 into expert 4.
template <typename T>
int32_t checked_expert_id(T id, const std::string& path, int64_t row, int64_t layer, int64_t num_experts) {
  R3_CHECK(std::cmp_greater_equal(id, 0) && std::cmp_less(id, num_experts), path, ": row ", row,
           " MoE layer ", layer, ": expert id ", id, " outside [0, ", num_experts, ")");
  return static_cast<int32_t>(id);
}

std::vector<int32_t> token_ids(const nlohmann::json& j, const std::string& path, const char* key) {
  bool ok = j.is_array() && !j.empty();
  std::vector<int32_t> ids;
  for (std::size_t i = 0; ok && i < j.size(); ++i) {
    const auto& v = j[i];
    ok = (v.is_number_unsigned() && v.get<uint64_t>() <= INT32_MAX) ||
         (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX);
    if (ok) ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  R3_CHECK(ok, path, ": ", key, " must be a non-empty list of token ids (integers in [0, 2^31))");
  return ids;
}

RoutingReplay from_json(const std::string& path, int64_t num_experts) {
  nlohmann::json j = read_json_file(path, kMaxReplayJsonBytes, "a replay file");
  RoutingReplay r;
  if (j.is_object()) {
    R3_CHECK(j.contains("routed_experts"), path, ": JSON object without 'routed_experts'");
    if (j.contains("prompt_ids")) r.prompt_ids = token_ids(j["prompt_ids"], path, "prompt_ids");
    if (j.contains("output_ids")) r.output_ids = token_ids(j["output_ids"], path, "output_ids");
    j = j["routed_experts"];
  }
  R3_CHECK(j.is_array() && !j.empty(), path, ": expected a non-empty list [rows][MoE layers][top_k]");
  r.rows = static_cast<int64_t>(j.size());
  for (std::size_t t = 0; t < j.size(); ++t) {
    R3_CHECK(j[t].is_array(), path, ": row ", t, " is not a list of MoE layers");
    if (t == 0) r.layers = static_cast<int64_t>(j[t].size());
    R3_CHECK(static_cast<int64_t>(j[t].size()) == r.layers, path, ": row ", t, " has ", j[t].size(),
             " MoE layers, row 0 has ", r.layers);
    for (std::size_t l = 0; l < j[t].size(); ++l) {
      const auto& choices = j[t][l];
      R3_CHECK(choices.is_array(), path, ": row ", t, " MoE layer ", l, " is not a list of expert ids");
      if (t == 0 && l == 0) r.top_k = static_cast<int64_t>(choices.size());
      R3_CHECK(static_cast<int64_t>(choices.size()) == r.top_k, path, ": row ", t, " MoE layer ", l, " has ",
               choices.size(), " ids, expected ", r.top_k);
      const auto row = static_cast<int64_t>(t), layer = static_cast<int64_t>(l);
      for (const auto& id : choices) {
        // nlohmann keeps an integer as uint64 when positive, int64 when negative, and one
        // beyond both as a float.
        if (id.is_number_unsigned()) {
          r.ids.push_back(checked_expert_id(id.get<uint64_t>(), path, row, layer, num_experts));
        } else if (id.is_number_integer()) {
          r.ids.push_back(checked_expert_id(id.get<int64_t>(), path, row, layer, num_experts));
        } else {
          R3_FAIL(path, ": row ", t, " MoE layer ", l, ": ", describe_json(id), " is not an integer expert id");
        }
      }
    }
  }
  if (r.prompt_ids && r.output_ids) {
    const auto expected = static_cast<int64_t>(r.prompt_ids->size() + r.output_ids->size()) - 1;
    R3_CHECK(r.rows == expected, path, ": ", r.rows, " rows of routed_experts, but ", r.prompt_ids->size(),
             " prompt_ids and ", r.output_ids->size(), " output_ids make ", expected, " (prompt + output - 1)");
  }
  return r;
}

RoutingReplay from_safetensors(const std::string& path, int64_t num_moe_layers, int64_t top_k,
                               int64_t num_experts) {
  // SafetensorsFile::open refuses a shape whose byte count overflows or differs from the data it
  // claims, so numel() of the view below is exactly what the file holds.
  auto file = SafetensorsFile::open(path);
  const SafetensorsEntry* e = file->find("topk_ids");
  R3_CHECK(e != nullptr, path, ": no 'topk_ids' tensor");
  R3_CHECK(e->shape.size() == 3, path, ": topk_ids must be [rows, MoE layers, top_k], found ",
           shape_to_string(e->shape));
  R3_CHECK(e->dtype == DType::I32 || e->dtype == DType::I64, path, ": topk_ids must be I32 or I64");
  RoutingReplay r;
  r.rows = e->shape[0];
  r.layers = e->shape[1];
  r.top_k = e->shape[2];
  // The layout is checked against the model before any id is read.
  R3_CHECK(r.layers == num_moe_layers, path, ": the routing has ", r.layers, " MoE layers, the model has ",
           num_moe_layers);
  R3_CHECK(r.top_k == top_k, path, ": the routing has top-", r.top_k, ", the model routes top-", top_k);
  Tensor t = file->view("topk_ids");
  const auto count = static_cast<std::size_t>(
      checked_mul(checked_mul(r.rows, r.layers, "topk_ids rows x layers"), r.top_k, "topk_ids element count"));
  R3_CHECK(count == static_cast<std::size_t>(t.numel()), path, ": topk_ids holds ", t.numel(), " ids, its shape ",
           count);
  const std::size_t width = e->dtype == DType::I32 ? 4 : 8;
  R3_CHECK(t.nbytes() == count * width, path, ": topk_ids is ", t.nbytes(), " bytes, its shape needs ", count * width);
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  r.ids.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto row = static_cast<int64_t>(i) / (r.layers * r.top_k), layer = static_cast<int64_t>(i) / r.top_k % r.layers;
    if (e->dtype == DType::I32) {
      int32_t v;
      std::memcpy(&v, bytes + 4 * i, 4);
      r.ids.push_back(checked_expert_id(v, path, row, layer, num_experts));
    } else {
      int64_t v;
      std::memcpy(&v, bytes + 8 * i, 8);
      r.ids.push_back(checked_expert_id(v, path, row, layer, num_experts));
    }
  }
  return r;
}

}  // namespace

std::vector<int32_t> RoutingReplay::slice(int64_t first, int64_t count) const {
  R3_CHECK(first >= 0 && first + count <= rows, "replay: rows [", first, ", ", first + count,
           ") needed, the replayed routing has ", rows);
  const int64_t per_row = layers * top_k;
  return {ids.begin() + first * per_row, ids.begin() + (first + count) * per_row};
}

void RoutingReplay::check_prompt(const std::vector<int32_t>& prompt) const {
  R3_CHECK(!prompt_ids || *prompt_ids == prompt, path, ": prompt_ids ", brief_ids(*prompt_ids),
           " differ from --ids ", brief_ids(prompt));
}

void RoutingReplay::check_inputs(const std::vector<int32_t>& inputs) const {
  if (!prompt_ids) return;
  std::vector<int32_t> recorded = *prompt_ids;  // token i was the input while row i was routed
  if (output_ids) recorded.insert(recorded.end(), output_ids->begin(), output_ids->end() - 1);
  const std::size_t n = std::min(recorded.size(), inputs.size());
  R3_CHECK(std::equal(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(n), recorded.begin()), path,
           ": --ids ", brief_ids(inputs), " are not the tokens the routing was recorded for (",
           brief_ids(recorded), ")");
}

RoutingReplay load_routing_replay(const std::string& path, int64_t num_moe_layers, int64_t top_k,
                                  int64_t num_experts) {
  const bool is_safetensors = path.size() >= 12 && path.substr(path.size() - 12) == ".safetensors";
  RoutingReplay r = is_safetensors ? from_safetensors(path, num_moe_layers, top_k, num_experts)
                                   : from_json(path, num_experts);
  r.path = path;
  R3_CHECK(r.layers == num_moe_layers, path, ": the routing has ", r.layers,
           " MoE layers, the model has ", num_moe_layers);
  R3_CHECK(r.top_k == top_k, path, ": the routing has top-", r.top_k, ", the model routes top-", top_k);
  for (int64_t row = 0; row < r.rows; ++row) {
    for (int64_t l = 0; l < r.layers; ++l) {
      const std::span<const int32_t> ids(r.ids.data() + (row * r.layers + l) * r.top_k,
                                         static_cast<std::size_t>(r.top_k));
      const std::string problem = moe::forced_row_problem(ids, num_experts);
      R3_CHECK(problem.empty(), path, ": row ", row, " MoE layer ", l, ": ", problem);
    }
  }
  return r;
}

}  // namespace r3::engine
