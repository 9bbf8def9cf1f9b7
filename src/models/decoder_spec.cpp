#include "models/decoder_spec.h"

#include <algorithm>

#include "core/check.h"
#include "core/checked.h"

namespace r3::models {

std::vector<int64_t> DecoderSpec::moe_layers() const {
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < layer_is_moe.size(); ++i) {
    if (layer_is_moe[i]) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

void DecoderSpec::validate() const {
  auto positive = [&](int64_t v, const char* name) {
    R3_CHECK(v > 0, family, " config: ", name, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_layers, "num_hidden_layers");
  positive(attention.num_heads, "num_attention_heads");
  positive(attention.num_kv_heads, "num_key_value_heads");
  positive(attention.head_dim, "head_dim");
  // Projection widths: checked, not wrapped, whatever the config holds.
  const std::string what = family + " config: num_attention_heads x head_dim";
  checked_mul(attention.num_heads, attention.head_dim, what.c_str());
  if (attention.kind == AttentionKind::kLatent) {
    const std::string v = family + " config: num_attention_heads x v_head_dim";
    checked_mul(attention.num_heads, attention.latent.v_head_dim, v.c_str());
  }
  R3_CHECK(attention.num_heads % attention.num_kv_heads == 0, family, " config: ",
           attention.num_heads, " attention heads not divisible by ", attention.num_kv_heads,
           " key/value heads");
  R3_CHECK(attention.head_dim % 2 == 0, family, " config: head_dim must be even for rotary");
  R3_CHECK(attention.rotary_dim >= 0 && attention.rotary_dim % 2 == 0 && attention.rotary_dim <= attention.head_dim,
           family, " config: rotary dim ", attention.rotary_dim, " must be even and at most head_dim");
  R3_CHECK(static_cast<int64_t>(layer_is_moe.size()) == num_layers, family,
           " config: layer kinds do not cover every layer");
  if (!moe_layers().empty()) {
    positive(moe.num_experts, "num_experts");
    positive(moe.expert_intermediate, "moe_intermediate_size");
    R3_CHECK(moe.top_k >= 1 && moe.top_k <= moe.num_experts, family,
             " config: num_experts_per_tok must be in [1, num_experts], got ", moe.top_k);
  }
  if (moe_layers().size() < static_cast<std::size_t>(num_layers)) {
    positive(dense_intermediate, "intermediate_size");
  }
  R3_CHECK(layer_attention.empty() || static_cast<int64_t>(layer_attention.size()) == num_layers, family,
           " config: attention kinds for ", layer_attention.size(), " of ", num_layers, " layers");
  if (std::find(layer_attention.begin(), layer_attention.end(), LayerAttention::kKimiDelta) != layer_attention.end()) {
    positive(linear_attention.num_heads, "linear attention num_heads");
    positive(linear_attention.head_dim, "linear attention head_dim");
    R3_CHECK(linear_attention.conv_kernel >= 1 && linear_attention.conv_kernel <= 64, family,
             " config: short convolution kernel of ", linear_attention.conv_kernel, " taps (1 to 64)");
    checked_mul(linear_attention.num_heads, linear_attention.head_dim, (family + " config: linear attention width").c_str());
  }
}

std::string expand_name(std::string pattern, int64_t layer, int64_t expert) {
  auto replace = [&](const std::string& key, int64_t value) {
    for (auto pos = pattern.find(key); pos != std::string::npos; pos = pattern.find(key)) {
      pattern.replace(pos, key.size(), std::to_string(value));
    }
  };
  replace("{i}", layer);
  if (expert >= 0) replace("{e}", expert);
  return pattern;
}

}  // namespace r3::models
