// OpenAI's /v1/completions as vLLM serves it, for token ids: the request body into engine
// requests (checked against the model before the engine sees them), and the engine's outputs into
// the response object. Without a tokenizer every choice's text is empty, its tokens are in
// `token_ids`, and logprob tokens are written "token_id:<id>" (what RL clients parse with
// return_tokens_as_token_ids). Extension: return_routed_experts (with routed_experts_start) puts
// each choice's routed experts in `routed_experts`: {"shape": [T, L, K], "layers": [MoE layer
// indices], "dtype": "int32", "data": base64 of little-endian int32}.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "models/model_info.h"
#include "server/sglang_api.h"

namespace r3::server {

struct CompletionRequest {
  std::vector<engine::RequestParams> prompts;  // each with its n samples
  bool return_token_ids = false;               // choices also carry prompt_token_ids
};

// Throws ApiError (400) naming the field for anything malformed, out of range or not supported.
CompletionRequest parse_completion(const nlohmann::json& body, const models::ModelInfo& info,
                                   const ApiLimits& limits, const std::string& model_name);

// samples[p][i]: sample i of prompt p. Choice index p * n + i.
nlohmann::json completion_response(const CompletionRequest& request,
                                   const std::vector<std::vector<CompletedSample>>& samples,
                                   const models::ModelInfo& info, const std::string& model_name,
                                   const std::string& id, int64_t created);

}  // namespace r3::server
