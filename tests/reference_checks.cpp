#include "reference_checks.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

namespace r3::test {

namespace {

// Expert ids of reference row (t, layer) as a sorted set.
std::vector<int64_t> reference_set(const Reference& ref, int64_t t, int64_t layer) {
  auto first = ref.topk_ids.begin() + (t * ref.layers + layer) * ref.top_k;
  std::vector<int64_t> ids(first, first + ref.top_k);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

std::vector<int64_t> forward_ids(const Reference& ref) { return {ref.input_ids.begin(), ref.input_ids.end() - 1}; }

std::vector<int64_t> prompt_ids(const Reference& ref) {
  return {ref.input_ids.begin(), ref.input_ids.begin() + ref.prompt_len};
}

void expect_forward_dump_matches(const Reference& ref, const std::string& dump_path) {
  auto file = SafetensorsFile::open(dump_path);
  EXPECT_EQ(file->metadata().at("moe_layers"), join(ref.moe_layers));
  ASSERT_EQ(file->find("logits")->shape, Shape({ref.tokens, ref.vocab}));
  ASSERT_EQ(file->find("topk_ids")->shape, Shape({ref.tokens, ref.layers, ref.top_k}));
  EXPECT_EQ(file->find("topk_ids")->dtype, DType::I32);
  EXPECT_EQ(file->find("logits")->dtype, DType::F32);

  const std::vector<double> logits = read_as_f64(*file, "logits");
  double max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    max_err = std::max(max_err, std::fabs(logits[i] - ref.logits[i]));
    max_ref = std::max(max_ref, std::fabs(ref.logits[i]));
  }
  EXPECT_LE(max_err / max_ref, 1e-4) << "max |r3 - ref| = " << max_err << ", max |ref| = " << max_ref;

  const std::vector<int64_t> ids = read_as_i64(*file, "topk_ids");
  const std::vector<double> weights = read_as_f64(*file, "topk_weights");
  for (int64_t t = 0; t < ref.tokens; ++t) {
    for (int64_t l = 0; l < ref.layers; ++l) {
      std::map<int64_t, double> ours, theirs;
      for (int64_t k = 0; k < ref.top_k; ++k) {
        const int64_t i = (t * ref.layers + l) * ref.top_k + k;
        ours[ids[i]] = weights[i];
        theirs[ref.topk_ids[i]] = ref.topk_weights[i];
      }
      ASSERT_EQ(ours.size(), theirs.size()) << "token " << t << " layer " << l;
      for (auto [expert, w] : theirs) {
        ASSERT_TRUE(ours.count(expert)) << "token " << t << " MoE layer " << l << ": expert " << expert << " missing";
        EXPECT_NEAR(ours[expert], w, 1e-4) << "token " << t << " MoE layer " << l;
      }
    }
  }
}

std::vector<int64_t> greedy_tokens_fixed_by(const Reference& ref) {
  if (ref.generate_agrees) return ref.generated;
  const double* row = ref.logits.data() + (ref.prompt_len - 1) * ref.vocab;
  return {static_cast<int64_t>(std::max_element(row, row + ref.vocab) - row)};
}

int64_t routed_rows_fixed_by(const Reference& ref) { return ref.generate_agrees ? ref.tokens : ref.prompt_len; }

void expect_generate_output_matches(const Reference& ref, const std::string& json_out) {
  const auto out = nlohmann::json::parse(json_out);
  EXPECT_EQ(out.at("prompt_ids").get<std::vector<int64_t>>(), prompt_ids(ref));
  const auto output = out.at("output_ids").get<std::vector<int64_t>>();
  const std::vector<int64_t> fixed = greedy_tokens_fixed_by(ref);
  if (ref.generate_agrees) {
    EXPECT_EQ(output, fixed);
  } else {
    ASSERT_FALSE(output.empty());
    EXPECT_EQ(output[0], fixed[0]) << "the first token is the forward's argmax";
  }
  const int64_t compared_rows = routed_rows_fixed_by(ref);
  EXPECT_EQ(out.at("moe_layers").get<std::vector<int64_t>>(), ref.moe_layers);

  // Rows: prompt + generated - 1 = every input of the reference forward.
  const auto& routed = out.at("routed_experts");
  ASSERT_EQ(static_cast<int64_t>(routed.size()), ref.tokens);
  for (int64_t t = 0; t < compared_rows; ++t) {
    ASSERT_EQ(static_cast<int64_t>(routed[t].size()), ref.layers);
    for (int64_t l = 0; l < ref.layers; ++l) {
      auto ours = routed[t][l].get<std::vector<int64_t>>();
      std::sort(ours.begin(), ours.end());
      EXPECT_EQ(ours, reference_set(ref, t, l)) << "row " << t << " MoE layer " << l;
    }
  }
}

}  // namespace r3::test
