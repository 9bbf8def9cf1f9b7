// libFuzzer target: a request body as the engine endpoints take it, for a model shaped like the
// qwen3_moe fixture (vocabulary 320, 3 MoE layers, top-2 of 8 experts). The first byte picks the
// path: bit 0 /v1/completions (else /generate), bit 2 a compressed body (bit 3: deflate, else
// gzip), inflated within 1 MiB; the rest is the body. Any input must end in a parsed request whose
// every token id is in the vocabulary and whose routing to replay names real experts, or in
// ApiError / r3::Error.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "io/json_file.h"
#include "server/api_error.h"
#include "server/body_encoding.h"
#include "server/openai_api.h"
#include "server/sglang_api.h"

namespace {

const r3::models::ModelInfo& fixture_info() {
  static const r3::models::ModelInfo info = [] {
    r3::models::ModelInfo i;
    i.family = i.architecture = "qwen3_moe";
    i.vocab_size = 320;
    i.hidden_size = 32;
    i.num_layers = 3;
    i.max_position_embeddings = 256;
    i.moe_layers = {0, 1, 2};
    i.num_experts = 8;
    i.top_k = 2;
    i.eos_token_ids = {0};
    return i;
  }();
  return info;
}

void check_prompts(const std::vector<r3::engine::RequestParams>& prompts) {
  const r3::models::ModelInfo& info = fixture_info();
  for (const r3::engine::RequestParams& p : prompts) {
    if (p.prompt.empty()) std::abort();  // an empty prompt accepted
    for (const int32_t id : p.prompt) {
      if (id < 0 || id >= info.vocab_size) std::abort();  // a token outside the vocabulary accepted
    }
    for (const int32_t id : p.forced_routing) {
      if (id < 0 || id >= info.num_experts) std::abort();  // a replayed expert that does not exist
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  constexpr int64_t kLimit = 1 << 20;
  try {
    if (mode & 4) body = r3::server::decode_body(std::move(body), (mode & 8) ? "deflate" : "gzip", kLimit);
    if (static_cast<int64_t>(body.size()) > kLimit && (mode & 4)) std::abort();  // inflated past the limit
    const nlohmann::json parsed = r3::parse_json(body, "the request body");
    if (mode & 1) {
      check_prompts(r3::server::parse_completion(parsed, fixture_info(), {}, "qwen3_moe").prompts);
    } else {
      check_prompts(r3::server::parse_generate(parsed, fixture_info(), {}).prompts);
    }
  } catch (const r3::server::ApiError&) {
  } catch (const r3::Error&) {
  }
  return 0;
}
