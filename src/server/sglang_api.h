// SGLang's native /generate: the request body into engine requests, checked against the model
// before the engine sees them, and the engine's outputs into SGLang's response objects
// (output_ids, meta_info with prompt_tokens, completion_tokens, finish_reason as SGLang's object,
// output_token_logprobs as [logprob, token_id, null] triples, routed_experts as base64 of
// little-endian int32 [T, num_hidden_layers, K] with zero rows for dense layers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "models/model_info.h"

namespace r3::server {

struct ApiLimits {
  int64_t max_prompts = 256;  // prompts in one request (a batch of input_ids)
};

struct GenerateRequest {
  std::vector<engine::RequestParams> prompts;
  bool batch = false;  // input_ids was a list of lists: the response is a list
  bool return_logprob = false;
};

// Throws ApiError (400) naming the field for anything malformed or out of range.
GenerateRequest parse_generate(const nlohmann::json& body, const models::ModelInfo& info, const ApiLimits& limits);

// What one prompt's sample produced, gathered from its outputs.
struct CompletedSample {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top_logprobs;
  engine::FinishReason finish = engine::FinishReason::kNone;
  int32_t matched_stop = -1;
  std::string abort_message;
  std::vector<int32_t> routed_experts;  // [rows, MoE layers, K]
  int64_t routed_rows = 0;
  std::vector<float> routing_margins;   // [rows, MoE layers]
  int64_t cached_prompt_tokens = 0;
};
// Adds what one output of a sample brought (its final one: the finish and the routed experts).
void append(CompletedSample& c, const engine::SampleOutput& s);
// Sample `index` of a request, from all its outputs.
CompletedSample gather_sample(const std::vector<engine::RequestOutput>& outputs, int64_t index = 0);

nlohmann::json generate_response(const engine::RequestParams& params, const CompletedSample& sample,
                                 const models::ModelInfo& info, bool return_logprob, const std::string& id);

// Routed experts [rows, MoE layers, K] as SGLang returns them: [rows, num_hidden_layers, K] with
// zero rows for the dense layers, little-endian int32, base64.
std::string routed_experts_base64(const std::vector<int32_t>& ids, int64_t rows, const models::ModelInfo& info);

// Standard base64 (RFC 4648, with padding).
std::string base64_encode(const void* data, std::size_t bytes);
// The bytes of standard base64 text (padding required where the length needs it); throws
// ApiError (400) naming `param` for anything else.
std::vector<unsigned char> base64_decode(const std::string& text, const std::string& param);

}  // namespace r3::server
