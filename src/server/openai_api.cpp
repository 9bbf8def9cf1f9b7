#include "server/openai_api.h"

#include <cstring>

#include "io/json_file.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace r3::server {

namespace {

using nlohmann::json;

constexpr int64_t kMaxLogprobs = 20;  // as vLLM
constexpr int64_t kMaxSamples = 64;   // n

// replay_routed_experts: the routed_experts object a response carries ({"shape": [T, L, K],
// "data": base64 little-endian int32, optional "layers" and "dtype"}) or a nested list [T][L][K];
// L must be the model's MoE layers and K its top-k, every id a logical expert of the model. The
// rows must cover the prompt (the engine checks that against the prompt).
std::vector<int32_t> replayed_routing(const json& v, const models::ModelInfo& info) {
  const std::string name = "replay_routed_experts";
  const auto layers = static_cast<int64_t>(info.moe_layers.size()), k = info.top_k;
  std::vector<int32_t> ids;
  if (v.is_object()) {
    const auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array() || shape->size() != 3) {
      throw ApiError(400, name + ".shape must be [rows, MoE layers, top_k]", name);
    }
    const int64_t rows = integer((*shape)[0], name + ".shape"), l = integer((*shape)[1], name + ".shape"),
                  kk = integer((*shape)[2], name + ".shape");
    if (rows < 1 || l != layers || kk != k) {
      throw ApiError(400, name + ".shape must be [rows >= 1, " + std::to_string(layers) + ", " + std::to_string(k) +
                              "] for this model", name);
    }
    if (const auto dtype = v.find("dtype"); dtype != v.end() && *dtype != "int32") {
      throw ApiError(400, name + ".dtype must be \"int32\"", name);
    }
    if (const auto given = v.find("layers"); given != v.end() && *given != json(info.moe_layers)) {
      throw ApiError(400, name + ".layers must be this model's MoE layers", name);
    }
    const auto data = v.find("data");
    if (data == v.end() || !data->is_string()) throw ApiError(400, name + ".data must be base64 text", name);
    const std::vector<unsigned char> bytes = base64_decode(data->get<std::string>(), name + ".data");
    if (static_cast<int64_t>(bytes.size()) != rows * layers * k * 4) {
      throw ApiError(400, name + ".data holds " + std::to_string(bytes.size()) + " bytes, not the " +
                              std::to_string(rows * layers * k * 4) + " of its shape", name);
    }
    ids.resize(static_cast<std::size_t>(rows * layers * k));
    std::memcpy(ids.data(), bytes.data(), bytes.size());  // little-endian int32 (sglang_api.cpp asserts the host is)
  } else if (v.is_array() && !v.empty()) {
    for (const json& row : v) {
      if (!row.is_array() || static_cast<int64_t>(row.size()) != layers) {
        throw ApiError(400, name + ": every row must list " + std::to_string(layers) + " MoE layers", name);
      }
      for (const json& layer : row) {
        if (!layer.is_array() || static_cast<int64_t>(layer.size()) != k) {
          throw ApiError(400, name + ": every layer must list top_k = " + std::to_string(k) + " ids", name);
        }
        for (const json& id : layer) ids.push_back(static_cast<int32_t>(integer(id, name)));
      }
    }
  } else {
    throw ApiError(400, name + " must be a routed_experts object or a [rows][layers][top_k] list", name);
  }
  for (const int32_t id : ids) {
    if (id < 0 || id >= info.num_experts) {
      throw ApiError(400, name + ": expert id " + std::to_string(id) + " is outside [0, " +
                              std::to_string(info.num_experts) + ")", name);
    }
  }
  return ids;
}

// The fields of a completion request that are not the prompt, into engine parameters.
engine::RequestParams parameters(const json& body, const models::ModelInfo& info) {
  engine::RequestParams p;
  p.sampling.temperature = 1.0;  // OpenAI's default
  for (const auto& [key, value] : body.items()) {
    if (value.is_null()) continue;
    if (key == "max_tokens") {
      p.max_new_tokens = integer(value, key);
      if (p.max_new_tokens < 1) {
        throw ApiError(400, "max_tokens must be at least 1, got " + std::to_string(p.max_new_tokens), key);
      }
    } else if (key == "temperature") {
      p.sampling.temperature = number(value, key);
      if (!(p.sampling.temperature >= 0)) throw ApiError(400, "temperature must be >= 0", key);
    } else if (key == "top_p") {
      p.sampling.top_p = number(value, key);
      if (!(p.sampling.top_p > 0 && p.sampling.top_p <= 1)) throw ApiError(400, "top_p must be in (0, 1]", key);
    } else if (key == "top_k") {
      const int64_t k = integer(value, key);
      if (k < -1) throw ApiError(400, "top_k must be -1 (no limit) or positive", key);
      p.sampling.top_k = k < 0 ? 0 : k;
    } else if (key == "min_p") {
      p.sampling.min_p = number(value, key);
      if (!(p.sampling.min_p >= 0 && p.sampling.min_p <= 1)) throw ApiError(400, "min_p must be in [0, 1]", key);
    } else if (key == "seed") {
      const int64_t seed = integer(value, key);
      if (seed < 0) throw ApiError(400, "seed must be >= 0", key);
      p.sampling.seed = static_cast<uint64_t>(seed);
    } else if (key == "stop_token_ids") {
      p.stop_token_ids = token_ids(value, key, info.vocab_size);
    } else if (key == "ignore_eos") {
      p.ignore_eos = flag(body, "ignore_eos");
    } else if (key == "logprobs") {
      p.logprobs = integer(value, key);
      if (p.logprobs < 0 || p.logprobs > kMaxLogprobs) {
        throw ApiError(400, "logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "]", key);
      }
    } else if (key == "n") {
      p.n = integer(value, key);
      if (p.n < 1 || p.n > kMaxSamples) throw ApiError(400, "n must be in [1, " + std::to_string(kMaxSamples) + "]", key);
    } else if (key == "return_routed_experts") {
      p.return_routed_experts = flag(body, "return_routed_experts");
    } else if (key == "routed_experts_start") {
      p.routed_experts_start = integer(value, key);
      if (p.routed_experts_start < 0) throw ApiError(400, "routed_experts_start must be >= 0", key);
    } else if (key == "echo" && flag(body, "echo")) {
      throw ApiError(400, "echo is not supported (there is no tokenizer to write the prompt's text)", key);
    } else if (key == "replay_routed_experts") {
      p.forced_routing = replayed_routing(value, info);
    } else if (key == "return_routing_margins") {
      p.return_routing_margins = flag(body, "return_routing_margins");
    } else if (key == "stop" && !(value.is_array() && value.empty())) {
      throw ApiError(400, "stop strings need a tokenizer, which this server does not have: use stop_token_ids", key);
    } else {
      refuse_unless_neutral(key, value, key);
    }
  }
  return p;
}

json logprobs_object(const CompletedSample& s) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (std::size_t i = 0; i < s.token_ids.size(); ++i) {
    tokens.push_back("token_id:" + std::to_string(s.token_ids[i]));
    token_logprobs.push_back(i < s.logprobs.size() ? json(s.logprobs[i]) : json(nullptr));
    offsets.push_back(0);  // no text
    if (i < s.top_logprobs.size()) {
      json entry = json::object();
      for (const engine::TokenLogprob& t : s.top_logprobs[i]) entry["token_id:" + std::to_string(t.token)] = t.logprob;
      top.push_back(entry);
    }
  }
  json out = {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"text_offset", offsets}};
  out["top_logprobs"] = s.top_logprobs.empty() ? json(nullptr) : top;
  return out;
}

}  // namespace

CompletionRequest parse_completion(const json& body, const models::ModelInfo& info, const ApiLimits& limits,
                                   const std::string& model_name) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (const auto model = body.find("model"); model != body.end() && !model->is_null()) {
    if (!model->is_string() || model->get<std::string>() != model_name) {
      throw ApiError(404, "model " + describe_json(*model) + " is not served here (this server serves \"" + model_name +
                              "\")", "model");
    }
  }
  const auto prompt = body.find("prompt");
  if (prompt == body.end()) throw ApiError(400, "prompt is required: a list of token ids, or a list of such lists", "prompt");
  if (prompt->is_string() || (prompt->is_array() && !prompt->empty() && prompt->front().is_string())) {
    throw ApiError(400, "text prompts need a tokenizer, which this server does not have: send token ids", "prompt");
  }
  if (!prompt->is_array() || prompt->empty()) {
    throw ApiError(400, "prompt must be a non-empty list of token ids, or a list of such lists", "prompt");
  }
  const bool batch = prompt->front().is_array();
  const json prompts = batch ? *prompt : json::array({*prompt});
  if (static_cast<int64_t>(prompts.size()) > limits.max_prompts) {
    throw ApiError(400, "prompt holds " + std::to_string(prompts.size()) + " prompts, more than the " +
                            std::to_string(limits.max_prompts) + " one request may carry", "prompt");
  }
  const engine::RequestParams base = parameters(body, info);
  CompletionRequest r;
  r.return_token_ids = flag(body, "return_token_ids");
  r.stream = flag(body, "stream");
  if (const auto options = body.find("stream_options"); options != body.end() && !options->is_null()) {
    if (!options->is_object()) throw ApiError(400, "stream_options must be an object", "stream_options");
    r.include_usage = flag(*options, "include_usage");
  }
  for (const json& ids : prompts) {
    engine::RequestParams p = base;
    p.prompt = token_ids(ids, "prompt", info.vocab_size);
    if (p.prompt.empty()) throw ApiError(400, "prompt: a prompt is empty", "prompt");
    r.prompts.push_back(std::move(p));
  }
  return r;
}

namespace {

json choice_object(const CompletionRequest& request, std::size_t prompt, int64_t sample_index, const CompletedSample& s,
                   const models::ModelInfo& info) {
  const engine::RequestParams& params = request.prompts[prompt];
  json choice = {{"index", static_cast<int64_t>(prompt) * params.n + sample_index}, {"text", ""}, {"token_ids", s.token_ids}};
  choice["finish_reason"] = s.finish == engine::FinishReason::kNone ? json(nullptr) : json(engine::finish_reason_name(s.finish));
  choice["stop_reason"] = s.finish == engine::FinishReason::kStop ? json(s.matched_stop) : json(nullptr);
  choice["logprobs"] = params.logprobs >= 0 ? logprobs_object(s) : json(nullptr);
  if (request.return_token_ids) choice["prompt_token_ids"] = params.prompt;
  if (params.return_routed_experts && s.finish != engine::FinishReason::kNone) {
    const auto layers = static_cast<int64_t>(info.moe_layers.size());
    choice["routed_experts"] = {
        {"shape", {s.routed_rows, layers, info.top_k}},
        {"layers", info.moe_layers},
        {"dtype", "int32"},
        {"data", base64_encode(s.routed_experts.data(), s.routed_experts.size() * sizeof(int32_t))}};
  }
  if (params.return_routing_margins && s.finish != engine::FinishReason::kNone) {
    const auto layers = static_cast<int64_t>(info.moe_layers.size());
    choice["routing_margins"] = {
        {"shape", {s.routed_rows, layers}},
        {"layers", info.moe_layers},
        {"dtype", "float32"},
        {"data", base64_encode(s.routing_margins.data(), s.routing_margins.size() * sizeof(float))}};
  }
  return choice;
}

}  // namespace

json completion_response(const CompletionRequest& request, const std::vector<std::vector<CompletedSample>>& samples,
                         const models::ModelInfo& info, const std::string& model_name, const std::string& id,
                         int64_t created) {
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (std::size_t p = 0; p < request.prompts.size(); ++p) {
    prompt_tokens += static_cast<int64_t>(request.prompts[p].prompt.size());
    for (std::size_t i = 0; i < samples[p].size(); ++i) {
      completion_tokens += static_cast<int64_t>(samples[p][i].token_ids.size());
      choices.push_back(choice_object(request, p, static_cast<int64_t>(i), samples[p][i], info));
    }
  }
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model_name},
          {"choices", choices},
          {"usage", usage_object(prompt_tokens, completion_tokens)}};
}

json completion_chunk(const CompletionRequest& request, std::size_t prompt, const engine::SampleOutput& delta,
                      const models::ModelInfo& info, const std::string& model_name, const std::string& id,
                      int64_t created) {
  CompletedSample s;
  append(s, delta);
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model_name},
          {"choices", json::array({choice_object(request, prompt, delta.index, s, info)})}};
}

json usage_object(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace r3::server
