// OpenAI's /v1/completions as vLLM serves it, for token ids: the request body into engine
// requests (checked against the model before the engine sees them), and the engine's outputs into
// the response object. Without a tokenizer every choice's text is empty, its tokens are in
// `token_ids`, and logprob tokens are written "token_id:<id>" (what RL clients parse with
// return_tokens_as_token_ids). Extension: return_routed_experts (with routed_experts_start) puts
// each choice's routed experts in `routed_experts`: {"shape": [T, L, K], "layers": [MoE layer
// indices], "dtype": "int32", "data": base64 of little-endian int32}; return_routing_margins puts
// the same rows' routing margins (moe/routing_rule.h) in `routing_margins`: {"shape": [T, L],
// "layers", "dtype": "float32", "data": base64 of little-endian float32}.
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
  bool stream = false;                         // server-sent events, one chunk per step's output
  bool include_usage = false;                  // stream_options.include_usage: a last chunk with usage
};

// Throws ApiError (400) naming the field for anything malformed, out of range or not supported.
CompletionRequest parse_completion(const nlohmann::json& body, const models::ModelInfo& info,
                                   const ApiLimits& limits, const std::string& model_name);

// samples[p][i]: sample i of prompt p. Choice index p * n + i.
nlohmann::json completion_response(const CompletionRequest& request,
                                   const std::vector<std::vector<CompletedSample>>& samples,
                                   const models::ModelInfo& info, const std::string& model_name,
                                   const std::string& id, int64_t created);

// One streamed chunk: what sample delta.index of prompt `prompt` produced in a step (its routed
// experts come with its final chunk).
nlohmann::json completion_chunk(const CompletionRequest& request, std::size_t prompt, const engine::SampleOutput& delta,
                                const models::ModelInfo& info, const std::string& model_name, const std::string& id,
                                int64_t created);

nlohmann::json usage_object(int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace r3::server
