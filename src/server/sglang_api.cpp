#include "server/sglang_api.h"

#include <bit>
#include <cstring>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace r3::server {

namespace {

using nlohmann::json;

engine::RequestParams sampling(const json& sp, const models::ModelInfo& info) {
  engine::RequestParams p;
  if (sp.is_null()) return p;
  if (!sp.is_object()) throw ApiError(400, "sampling_params must be an object", "sampling_params");
  for (const auto& [key, value] : sp.items()) {
    const std::string name = "sampling_params." + key;
    if (value.is_null()) continue;
    if (key == "max_new_tokens") {
      p.max_new_tokens = integer(value, name);
      if (p.max_new_tokens < 1) {
        throw ApiError(400, name + " must be at least 1 (r3 generates at least one token), got " +
                                std::to_string(p.max_new_tokens), name);
      }
    } else if (key == "temperature") {
      p.sampling.temperature = number(value, name);
      if (!(p.sampling.temperature >= 0)) throw ApiError(400, name + " must be >= 0", name);
    } else if (key == "top_p") {
      p.sampling.top_p = number(value, name);
      if (!(p.sampling.top_p > 0 && p.sampling.top_p <= 1)) throw ApiError(400, name + " must be in (0, 1]", name);
    } else if (key == "top_k") {
      const int64_t k = integer(value, name);  // SGLang: -1 (or 0) for no limit
      if (k < -1) throw ApiError(400, name + " must be -1 (no limit) or positive", name);
      p.sampling.top_k = k < 0 ? 0 : k;
    } else if (key == "min_p") {
      p.sampling.min_p = number(value, name);
      if (!(p.sampling.min_p >= 0 && p.sampling.min_p <= 1)) throw ApiError(400, name + " must be in [0, 1]", name);
    } else if (key == "seed") {
      const int64_t seed = integer(value, name);
      if (seed < 0) throw ApiError(400, name + " must be >= 0", name);
      p.sampling.seed = static_cast<uint64_t>(seed);
    } else if (key == "stop_token_ids") {
      p.stop_token_ids = token_ids(value, name, info.vocab_size);
    } else if (key == "ignore_eos") {
      if (!value.is_boolean()) throw ApiError(400, name + " must be true or false", name);
      p.ignore_eos = value.get<bool>();
    } else if (key == "n") {
      p.n = integer(value, name);
      if (p.n != 1) throw ApiError(400, name + ": /generate takes one sample per prompt (repeat the prompt)", name);
    } else {
      // Penalties, logit bias, structured output: refused unless neutral. Other fields (stop
      // strings with no tokenizer to match them, ...) are left, as SGLang leaves what a model
      // does not use.
      refuse_unless_neutral(key, value, name);
    }
  }
  return p;
}


}  // namespace

GenerateRequest parse_generate(const json& body, const models::ModelInfo& info, const ApiLimits& limits) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (body.contains("text") && !body.contains("input_ids")) {
    throw ApiError(400, "text prompts need a tokenizer, which this server does not have: send input_ids (token ids)",
                   "text");
  }
  const auto ids = body.find("input_ids");
  if (ids == body.end() || !ids->is_array() || ids->empty()) {
    throw ApiError(400, "input_ids must be a non-empty list of token ids, or a list of such lists", "input_ids");
  }
  if (flag(body, "stream")) throw ApiError(400, "streaming /generate is not supported yet", "stream");
  GenerateRequest r;
  r.batch = ids->front().is_array();
  r.return_logprob = flag(body, "return_logprob");
  const bool routed = flag(body, "return_routed_experts");
  int64_t routed_start = 0;
  if (const auto start = body.find("routed_experts_start_len"); start != body.end() && !start->is_null()) {
    routed_start = integer(*start, "routed_experts_start_len");
    if (routed_start < 0) throw ApiError(400, "routed_experts_start_len must be >= 0", "routed_experts_start_len");
  }
  const json prompts = r.batch ? *ids : json::array({*ids});
  if (static_cast<int64_t>(prompts.size()) > limits.max_prompts) {
    throw ApiError(400, "input_ids holds " + std::to_string(prompts.size()) + " prompts, more than the " +
                            std::to_string(limits.max_prompts) + " one request may carry", "input_ids");
  }
  const auto sp = body.find("sampling_params");
  const engine::RequestParams base = sampling(sp == body.end() ? json() : *sp, info);
  for (const json& prompt : prompts) {
    engine::RequestParams p = base;
    p.prompt = token_ids(prompt, "input_ids", info.vocab_size);
    if (p.prompt.empty()) throw ApiError(400, "input_ids: a prompt is empty", "input_ids");
    p.logprobs = r.return_logprob ? 0 : -1;
    p.return_routed_experts = routed;
    p.routed_experts_start = routed_start;
    r.prompts.push_back(std::move(p));
  }
  return r;
}

void append(CompletedSample& c, const engine::SampleOutput& s) {
  c.token_ids.insert(c.token_ids.end(), s.token_ids.begin(), s.token_ids.end());
  c.logprobs.insert(c.logprobs.end(), s.logprobs.begin(), s.logprobs.end());
  c.top_logprobs.insert(c.top_logprobs.end(), s.top_logprobs.begin(), s.top_logprobs.end());
  if (s.finish == engine::FinishReason::kNone) return;
  c.finish = s.finish;
  c.matched_stop = s.matched_stop;
  c.abort_message = s.abort_message;
  c.routed_experts = s.routed_experts;
  c.routed_rows = s.routed_rows;
  c.routing_margins = s.routing_margins;
  c.cached_prompt_tokens = s.cached_prompt_tokens;
}

CompletedSample gather_sample(const std::vector<engine::RequestOutput>& outputs, int64_t index) {
  CompletedSample c;
  for (const auto& out : outputs) {
    for (const auto& s : out.samples) {
      if (s.index == index) append(c, s);
    }
  }
  return c;
}

std::string base64_encode(const void* data, std::size_t bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((bytes + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes; i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    for (int shift : {18, 12, 6, 0}) out.push_back(kAlphabet[(v >> shift) & 63]);
  }
  if (i < bytes) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (i + 1 < bytes ? uint32_t{p[i + 1]} << 8 : 0);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::vector<unsigned char> base64_decode(const std::string& text, const std::string& param) {
  if (text.size() % 4 != 0) throw ApiError(400, param + ": base64 text of " + std::to_string(text.size()) +
                                                    " characters, not a multiple of 4", param);
  const auto value = [&](char c) -> uint32_t {
    if (c >= 'A' && c <= 'Z') return static_cast<uint32_t>(c - 'A');
    if (c >= 'a' && c <= 'z') return static_cast<uint32_t>(c - 'a' + 26);
    if (c >= '0' && c <= '9') return static_cast<uint32_t>(c - '0' + 52);
    if (c == '+') return 62;
    if (c == '/') return 63;
    throw ApiError(400, param + ": not base64 (a character outside the alphabet)", param);
  };
  std::vector<unsigned char> out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') throw ApiError(400, param + ": misplaced base64 padding", param);
    uint32_t v = (value(text[i]) << 18) | (value(text[i + 1]) << 12);
    if (pad < 2) v |= value(text[i + 2]) << 6;
    if (pad < 1) v |= value(text[i + 3]);
    out.push_back(static_cast<unsigned char>(v >> 16));
    if (pad < 2) out.push_back(static_cast<unsigned char>((v >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<unsigned char>(v & 0xff));
  }
  return out;
}

std::string routed_experts_base64(const std::vector<int32_t>& ids, int64_t rows, const models::ModelInfo& info) {
  static_assert(std::endian::native == std::endian::little, "routed experts are sent as little-endian int32");
  const int64_t k = info.top_k, moe = static_cast<int64_t>(info.moe_layers.size()), layers = info.num_layers;
  std::vector<int32_t> full(static_cast<std::size_t>(rows * layers * k), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < moe; ++j) {
      std::memcpy(full.data() + (r * layers + info.moe_layers[static_cast<std::size_t>(j)]) * k,
                  ids.data() + (r * moe + j) * k, static_cast<std::size_t>(k) * sizeof(int32_t));
    }
  }
  return base64_encode(full.data(), full.size() * sizeof(int32_t));
}

json generate_response(const engine::RequestParams& params, const CompletedSample& sample, const models::ModelInfo& info,
                       bool return_logprob, const std::string& id) {
  json finish;
  switch (sample.finish) {
    case engine::FinishReason::kStop: finish = {{"type", "stop"}, {"matched", sample.matched_stop}}; break;
    case engine::FinishReason::kAbort: finish = {{"type", "abort"}, {"message", sample.abort_message}}; break;
    default: finish = {{"type", "length"}, {"length", static_cast<int64_t>(sample.token_ids.size())}}; break;
  }
  json meta = {{"id", id},
               {"prompt_tokens", static_cast<int64_t>(params.prompt.size())},
               {"completion_tokens", static_cast<int64_t>(sample.token_ids.size())},
               {"cached_tokens", sample.cached_prompt_tokens},
               {"finish_reason", finish}};
  if (return_logprob) {
    json triples = json::array();
    for (std::size_t i = 0; i < sample.token_ids.size() && i < sample.logprobs.size(); ++i) {
      triples.push_back({sample.logprobs[i], sample.token_ids[i], nullptr});
    }
    meta["output_token_logprobs"] = triples;
  }
  if (params.return_routed_experts) {
    meta["routed_experts"] = routed_experts_base64(sample.routed_experts, sample.routed_rows, info);
  }
  return {{"text", ""}, {"output_ids", sample.token_ids}, {"meta_info", meta}};
}

}  // namespace r3::server
