// `r3 serve`'s HTTP layer over loopback with a real HTTP client (cpp-httplib's): /health,
// /v1/models, SGLang's /generate (tokens, logprobs and routed experts equal to what the engine
// gives directly; SGLang's layout for the experts: base64 int32 [T, num_hidden_layers, K]),
// batches, the error shape and statuses for bad input, the body limit and the API key.
#include <gtest/gtest.h>

#include <httplib.h>

#include <cctype>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "models/registry.h"
#include "server/http_server.h"
#include "served_model.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

using nlohmann::json;

TEST(HttpServer, HealthAndModels) {
  Served s;
  auto c = s.client();
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body), json({{"status", "ok"}}));
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m.at("object"), "list");
  EXPECT_EQ(m.at("data").at(0).at("id"), "qwen3_moe");
  EXPECT_EQ(m.at("data").at(0).at("max_model_len"), s.model().info().max_position_embeddings);
}

TEST(HttpServer, GenerateReturnsWhatTheEngineComputesInSglangsLayout) {
  Served s;
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 5};
  engine::Engine direct(s.model(), s.ctx());
  engine::RequestParams p = greedy_request(prompt, 6);
  p.logprobs = 0;
  direct.submit(p);
  const EngineResult want = engine_run_all(direct).begin()->second;

  auto c = s.client();
  const json body = {{"input_ids", prompt},
                     {"sampling_params", {{"max_new_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}}},
                     {"return_logprob", true},
                     {"return_routed_experts", true}};
  const json r = post(c, "/generate", body.dump(), 200);
  EXPECT_EQ(r.at("output_ids").get<std::vector<int32_t>>(), want.tokens);
  const json& meta = r.at("meta_info");
  EXPECT_EQ(meta.at("prompt_tokens"), 5);
  EXPECT_EQ(meta.at("completion_tokens"), 6);
  EXPECT_EQ(meta.at("finish_reason"), json({{"type", "length"}, {"length", 6}}));
  ASSERT_EQ(meta.at("output_token_logprobs").size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    const json& triple = meta.at("output_token_logprobs")[i];
    EXPECT_FLOAT_EQ(triple[0].get<float>(), want.logprobs[i]);
    EXPECT_EQ(triple[1], want.tokens[i]);
    EXPECT_TRUE(triple[2].is_null());
  }
  // [T, num_hidden_layers, K]: every layer of this model is an MoE layer, so the rows are the engine's.
  const auto& info = s.model().info();
  ASSERT_EQ(static_cast<int64_t>(info.moe_layers.size()), info.num_layers);
  EXPECT_EQ(base64_int32(meta.at("routed_experts").get<std::string>()), want.routed);
  EXPECT_EQ(static_cast<int64_t>(want.routed.size()), (5 + 6 - 1) * info.num_layers * info.top_k);
}

TEST(HttpServer, ABatchOfPromptsGetsOneAnswerEach) {
  Served s;
  auto c = s.client();
  const json body = {{"input_ids", {{1, 2, 3}, {4, 5}}},
                     {"sampling_params", {{"max_new_tokens", 3}, {"stop_token_ids", json::array()}, {"ignore_eos", true}}}};
  const json r = post(c, "/generate", body.dump(), 200);
  ASSERT_TRUE(r.is_array());
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].at("meta_info").at("prompt_tokens"), 3);
  EXPECT_EQ(r[1].at("meta_info").at("prompt_tokens"), 2);
  EXPECT_EQ(r[1].at("output_ids").size(), 3u);
}

TEST(HttpServer, BadInputIsA400InVllmsErrorShapeBeforeTheEngine) {
  Served s;
  auto c = s.client();
  const auto expect_error = [&](const std::string& body, int status, const std::string& says, const json& param) {
    const json e = post(c, "/generate", body, status);
    ASSERT_TRUE(e.contains("error")) << body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << e.dump();
    EXPECT_EQ(e["error"]["code"], status);
    EXPECT_EQ(e["error"]["param"], param);
    EXPECT_TRUE(e["error"]["type"].is_string());
  };
  expect_error(R"({"input_ids": [1, 320]})", 400, "token id 320 is outside the vocabulary [0, 320)", "input_ids");
  expect_error(R"({"input_ids": [1, -1]})", 400, "token id -1", "input_ids");
  expect_error(R"({"input_ids": [1], "sampling_params": {"stop_token_ids": [1000]}})", 400, "token id 1000",
               "sampling_params.stop_token_ids");
  expect_error(R"({"input_ids": [1], "sampling_params": {"top_p": 0}})", 400, "(0, 1]", "sampling_params.top_p");
  expect_error(R"({"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}})", 400, "must be an integer",
               "sampling_params.max_new_tokens");
  expect_error(R"({"text": "hello"})", 400, "input_ids (token ids)", "text");
  expect_error(R"({"input_ids": []})", 400, "non-empty", "input_ids");
  expect_error(R"({"input_ids": [1, 2)", 400, "malformed JSON", nullptr);
  expect_error(std::string(100, '[') + std::string(100, ']'), 400, "nested deeper than 64 levels", nullptr);
  expect_error(R"([1, 2])", 400, "JSON object", nullptr);
  expect_error(R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 100000}})", 400, "max model length",
               "input_ids");
  expect_error(R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -3}})", 400, "max_new_tokens",
               "sampling_params.max_new_tokens");
  expect_error(R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1e30}})", 400, "must be an integer",
               "sampling_params.max_new_tokens");
  expect_error(R"({"input_ids": "1, 2"})", 400, "input_ids", "input_ids");
  const auto missing = c.Get("/v2/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], 404);
}

// Zero new tokens and integers past 2^63 - 1 are refused by the parser, naming the field and the
// value as sent (not by the engine naming the prompt, nor wrapped negative).
TEST(HttpServer, ZeroTokensAndHugeIntegersAreRefusedByName) {
  Served s;
  auto c = s.client();
  json e = post(c, "/v1/completions", R"({"prompt": [1], "max_tokens": 0})", 400);
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_EQ(e["error"]["message"], "max_tokens must be at least 1, got 0");
  e = post(c, "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}})", 400);
  EXPECT_EQ(e["error"]["param"], "sampling_params.max_new_tokens");
  e = post(c, "/v1/completions", R"({"prompt": [1], "max_tokens": 9223372036854775808})", 400);
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_EQ(e["error"]["message"], "max_tokens = 9223372036854775808 is too large (at most 9223372036854775807)");
  e = post(c, "/v1/completions", R"({"prompt": [1], "max_tokens": 2, "seed": 18446744073709551615})", 400);
  EXPECT_EQ(e["error"]["param"], "seed");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("18446744073709551615 is too large"), std::string::npos)
      << e.dump();
}

// Fields that would change the result and that r3 does not implement are a 400 naming them, on
// both endpoints, rather than accepted and ignored; their neutral values pass.
TEST(HttpServer, FieldsThatWouldChangeTheResultAreRefusedUnlessNeutral) {
  Served s;
  auto c = s.client();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"logit_bias", R"({"5": 100})"}, {"presence_penalty", "0.5"}, {"frequency_penalty", "-1"},
      {"repetition_penalty", "1.2"},   {"best_of", "3"},            {"min_tokens", "2"},
      {"prompt_logprobs", "1"},        {"response_format", R"({"type": "json_object"})"},
      {"guided_json", R"({"type": "object"})"}, {"top_logprobs", "2"}};
  for (const auto& [field, value] : refused) {
    json e = post(c, "/v1/completions", R"({"prompt": [1], "max_tokens": 2, ")" + field + "\": " + value + "}", 400);
    EXPECT_EQ(e["error"]["param"], field);
    EXPECT_NE(e["error"]["message"].get<std::string>().find("not supported by r3"), std::string::npos) << e.dump();
    e = post(c, "/generate",
             R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 2, ")" + field + "\": " + value + "}}", 400);
    EXPECT_EQ(e["error"]["param"], "sampling_params." + field);
  }
  const json neutral = post(c, "/v1/completions", R"({"prompt": [1], "max_tokens": 2, "logit_bias": {},
      "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "best_of": 1, "min_tokens": 0,
      "response_format": {"type": "text"}, "top_logprobs": 0, "prompt_logprobs": null})", 200);
  EXPECT_EQ(neutral["choices"][0]["token_ids"].size(), 2u);
  post(c, "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "presence_penalty": 0,
      "frequency_penalty": 0, "repetition_penalty": 1.0, "min_new_tokens": 0}})", 200);
}

// vLLM's /v1/completions for token ids: n seeded samples per prompt, logprobs with the top
// tokens as "token_id:<id>", prompt_token_ids, and the routed experts object; every choice equals
// what the engine gives for the same request directly.
TEST(HttpServer, CompletionsReturnWhatTheEngineComputesInVllmsLayout) {
  Served s;
  const std::vector<int32_t> prompt = {9, 8, 7, 6};
  engine::RequestParams p;
  p.prompt = prompt;
  p.max_new_tokens = 5;
  p.n = 2;
  p.sampling.temperature = 0.8;
  p.sampling.seed = 7;
  p.logprobs = 2;
  p.ignore_eos = true;
  p.return_routed_experts = true;
  engine::Engine direct(s.model(), s.ctx());
  const engine::RequestId id = direct.submit(p);
  const EngineResults want = engine_run_all(direct);

  auto c = s.client();
  const json body = {{"model", "qwen3_moe"}, {"prompt", prompt},     {"max_tokens", 5},
                     {"n", 2},               {"temperature", 0.8},   {"seed", 7},
                     {"logprobs", 2},        {"ignore_eos", true},   {"return_routed_experts", true},
                     {"return_token_ids", true}};
  const json r = post(c, "/v1/completions", body.dump(), 200);
  EXPECT_EQ(r.at("object"), "text_completion");
  EXPECT_EQ(r.at("model"), "qwen3_moe");
  ASSERT_EQ(r.at("choices").size(), 2u);
  const auto& info = s.model().info();
  for (int64_t i = 0; i < 2; ++i) {
    const json& choice = r.at("choices")[static_cast<std::size_t>(i)];
    const EngineResult& w = want.at({id, i});
    EXPECT_EQ(choice.at("index"), i);
    EXPECT_EQ(choice.at("token_ids").get<std::vector<int32_t>>(), w.tokens);
    EXPECT_EQ(choice.at("prompt_token_ids").get<std::vector<int32_t>>(), prompt);
    EXPECT_EQ(choice.at("finish_reason"), "length");
    const json& lp = choice.at("logprobs");
    ASSERT_EQ(lp.at("tokens").size(), 5u);
    for (std::size_t t = 0; t < 5; ++t) {
      EXPECT_EQ(lp.at("tokens")[t], "token_id:" + std::to_string(w.tokens[t]));
      EXPECT_FLOAT_EQ(lp.at("token_logprobs")[t].get<float>(), w.logprobs[t]);
      ASSERT_EQ(lp.at("top_logprobs")[t].size(), 2u);
      for (const auto& top : w.top[t]) {
        EXPECT_FLOAT_EQ(lp.at("top_logprobs")[t].at("token_id:" + std::to_string(top.token)).get<float>(), top.logprob);
      }
    }
    const json& routed = choice.at("routed_experts");
    EXPECT_EQ(routed.at("shape"), json({4 + 5 - 1, static_cast<int64_t>(info.moe_layers.size()), info.top_k}));
    EXPECT_EQ(routed.at("layers").get<std::vector<int64_t>>(), info.moe_layers);
    EXPECT_EQ(routed.at("dtype"), "int32");
    EXPECT_EQ(base64_int32(routed.at("data").get<std::string>()), w.routed);
  }
  EXPECT_EQ(r.at("usage"), json({{"prompt_tokens", 4}, {"completion_tokens", 10}, {"total_tokens", 14}}));
  EXPECT_NE(r.at("choices")[0].at("token_ids"), r.at("choices")[1].at("token_ids")) << "two samples drew the same";

  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": "hello"})", 400)["error"]["param"], "prompt");
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": [1], "model": "other"})", 404)["error"]["param"], "model");
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": [1], "stop": ["x"]})", 400)["error"]["param"], "stop");
  // A body of invalid UTF-8: the parser's message quotes the bytes it stopped at, and the answer
  // still goes out (written with replacement characters).
  const json bad_utf8 = post(c, "/v1/completions", "{\"prompt\": [1], \"model\": \"\xff\xfe\"}", 400);
  EXPECT_NE(bad_utf8["error"]["message"].get<std::string>().find("ill-formed UTF-8"), std::string::npos);
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": [1], "logprobs": 21})", 400)["error"]["param"], "logprobs");
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": [[1], [400]]})", 400)["error"]["param"], "prompt");
}

// return_routing_margins: each choice's routing margins, [T, L] float32, equal to the engine's
// for the same request, in the rows routed_experts covers.
TEST(HttpServer, CompletionsReturnTheEnginesRoutingMargins) {
  Served s;
  const std::vector<int32_t> prompt = {9, 8, 7, 6};
  engine::Engine direct(s.model(), s.ctx());
  engine::RequestParams p = greedy_request(prompt, 5);
  p.return_routing_margins = true;
  p.routed_experts_start = 1;
  const std::vector<float> want = run_one(direct, p).margins;
  auto c = s.client();
  const json r = post(c, "/v1/completions", R"({"prompt": [9, 8, 7, 6], "max_tokens": 5, "temperature": 0,
      "ignore_eos": true, "return_routed_experts": true, "return_routing_margins": true, "routed_experts_start": 1})",
                      200);
  const json& choice = r.at("choices").at(0);
  const json& margins = choice.at("routing_margins");
  const int64_t layers = static_cast<int64_t>(s.model().info().moe_layers.size());
  EXPECT_EQ(margins.at("shape"), json({4 + 5 - 1 - 1, layers}));
  EXPECT_EQ(margins.at("dtype"), "float32");
  EXPECT_EQ(margins.at("layers"), choice.at("routed_experts").at("layers"));
  const std::vector<int32_t> bits = base64_int32(margins.at("data").get<std::string>());
  std::vector<float> got(bits.size());
  std::memcpy(got.data(), bits.data(), bits.size() * sizeof(float));
  EXPECT_EQ(got, want);
  EXPECT_EQ(static_cast<int64_t>(got.size()), (4 + 5 - 2) * layers);
}

// A streamed completion: server-sent events whose token ids add up to the unstreamed answer,
// the routed experts with each choice's last chunk, a usage chunk when asked, [DONE] last.
TEST(HttpServer, StreamedCompletionsAddUpToTheAnswer) {
  Served s;
  auto c = s.client();
  // Two prompts of two seeded samples each: every choice's tokens count in the usage chunk.
  const json base = {{"prompt", {{7, 7, 3}, {2, 9}}}, {"max_tokens", 4}, {"temperature", 0.7}, {"seed", 3}, {"n", 2},
                     {"ignore_eos", true}, {"logprobs", 0}, {"return_routed_experts", true}};
  const json whole = post(c, "/v1/completions", base.dump(), 200);
  json streamed_body = base;
  streamed_body["stream"] = true;
  streamed_body["stream_options"] = {{"include_usage", true}};
  const auto res = c.Post("/v1/completions", streamed_body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::vector<std::string> events;
  for (std::size_t at = 0; (at = res->body.find("data: ", at)) != std::string::npos;) {
    const std::size_t end = res->body.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    events.push_back(res->body.substr(at + 6, end - at - 6));
    at = end;
  }
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage.at("choices").empty());
  EXPECT_EQ(usage.at("usage"), whole.at("usage"));
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, json> last;
  for (std::size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk.at("object"), "text_completion");
    ASSERT_EQ(chunk.at("choices").size(), 1u);
    const json& choice = chunk.at("choices")[0];
    const auto more = choice.at("token_ids").get<std::vector<int32_t>>();
    auto& mine = tokens[choice.at("index").get<int64_t>()];
    mine.insert(mine.end(), more.begin(), more.end());
    EXPECT_EQ(choice.at("logprobs").at("tokens").size(), more.size());
    last[choice.at("index").get<int64_t>()] = choice;
  }
  ASSERT_EQ(tokens.size(), 4u);
  EXPECT_EQ(usage.at("usage").at("completion_tokens"), 16);
  for (int64_t i = 0; i < 4; ++i) {
    const json& want = whole.at("choices")[static_cast<std::size_t>(i)];
    EXPECT_EQ(tokens[i], want.at("token_ids").get<std::vector<int32_t>>());
    EXPECT_EQ(last[i].at("finish_reason"), "length");
    EXPECT_EQ(last[i].at("routed_experts"), want.at("routed_experts"));
  }
}

// Replay over HTTP: a rollout's routed experts sent back with its tokens as the prompt are what
// the second run routes with (captured equal, next token equal); malformed replays are refused
// before the engine.
TEST(HttpServer, CompletionsReplayTheRoutingTheyReturned) {
  Served s;
  auto c = s.client();
  const std::vector<int32_t> prompt = {11, 12, 13};
  const json first = post(c, "/v1/completions", json({{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0},
                                                      {"ignore_eos", true}, {"return_routed_experts", true}}).dump(), 200);
  const json& rollout = first.at("choices")[0];
  const auto generated = rollout.at("token_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(generated.size(), 5u);
  std::vector<int32_t> teacher = prompt;
  teacher.insert(teacher.end(), generated.begin(), generated.begin() + 4);  // rows: prompt + 4 = the routing's
  const json again = post(c, "/v1/completions",
                          json({{"prompt", teacher}, {"max_tokens", 1}, {"temperature", 0}, {"ignore_eos", true},
                                {"return_routed_experts", true}, {"replay_routed_experts", rollout.at("routed_experts")}})
                              .dump(),
                          200);
  const json& replayed = again.at("choices")[0];
  EXPECT_EQ(replayed.at("token_ids"), json({generated[4]}));
  EXPECT_EQ(replayed.at("routed_experts"), rollout.at("routed_experts"));

  // The same routing as a nested list is accepted too.
  const auto& info = s.model().info();
  const std::vector<int32_t> ids = base64_int32(rollout.at("routed_experts").at("data").get<std::string>());
  json nested = json::array();
  const auto layers = static_cast<int64_t>(info.moe_layers.size());
  for (std::size_t r = 0; r < ids.size() / static_cast<std::size_t>(layers * info.top_k); ++r) {
    json row = json::array();
    for (int64_t l = 0; l < layers; ++l) {
      const auto at = ids.begin() + static_cast<std::ptrdiff_t>((static_cast<int64_t>(r) * layers + l) * info.top_k);
      row.push_back(std::vector<int32_t>(at, at + info.top_k));
    }
    nested.push_back(row);
  }
  const json as_list = post(c, "/v1/completions",
                            json({{"prompt", teacher}, {"max_tokens", 1}, {"temperature", 0}, {"ignore_eos", true},
                                  {"replay_routed_experts", nested}}).dump(), 200);
  EXPECT_EQ(as_list.at("choices")[0].at("token_ids"), json({generated[4]}));

  const auto refused = [&](json replay, const std::string& says) {
    const json e = post(c, "/v1/completions", json({{"prompt", teacher}, {"max_tokens", 1},
                                                    {"replay_routed_experts", replay}}).dump(), 400);
    EXPECT_EQ(e["error"]["param"].get<std::string>().rfind("replay_routed_experts", 0), 0u) << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << e.dump();
  };
  json wrong_shape = rollout.at("routed_experts");
  wrong_shape["shape"][2] = info.top_k + 1;
  refused(wrong_shape, "shape must be");
  json bad_data = rollout.at("routed_experts");
  bad_data["data"] = "AAA*";
  refused(bad_data, "not base64");
  json short_data = rollout.at("routed_experts");
  short_data["data"] = "AAAAAA==";
  refused(short_data, "bytes, not the");
  json out_of_range = nested;
  out_of_range[0][0][0] = info.num_experts;
  refused(out_of_range, "expert id " + std::to_string(info.num_experts) + " is outside");
  // Rows that do not cover the prompt: the engine's reason.
  json too_few = nested;
  too_few.erase(too_few.size() - 1);
  const json e = post(c, "/v1/completions", json({{"prompt", teacher}, {"max_tokens", 1},
                                                  {"replay_routed_experts", too_few}}).dump(), 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("fewer than the"), std::string::npos) << e.dump();
}

// The same request through `r3 generate --json` and both endpoints: the same tokens, and routed
// experts that decode (SGLang's base64 [T, num_hidden_layers, K]; vLLM-style [T, L, K]) to the
// command's rows.
TEST(HttpServer, RoutedExpertsEqualThoseOfTheGenerateCommand) {
  Served s;
  const CommandResult run = run_r3("generate -q --json --ignore-eos --max-new-tokens 5 --ids 3,17,42,99 --model " +
                                   family_dir("qwen3_moe"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json want = json::parse(run.out);
  std::vector<int32_t> rows;
  for (const json& row : want.at("routed_experts")) {
    for (const json& layer : row) {
      for (const json& id : layer) rows.push_back(id.get<int32_t>());
    }
  }
  auto c = s.client();
  const json sglang = post(c, "/generate", R"({"input_ids": [3, 17, 42, 99], "return_routed_experts": true,
      "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}})", 200);
  EXPECT_EQ(sglang.at("output_ids"), want.at("output_ids"));
  EXPECT_EQ(base64_int32(sglang.at("meta_info").at("routed_experts").get<std::string>()), rows);
  const json vllm = post(c, "/v1/completions", R"({"prompt": [3, 17, 42, 99], "max_tokens": 5, "temperature": 0,
      "ignore_eos": true, "return_routed_experts": true})", 200);
  const json& choice = vllm.at("choices").at(0);
  EXPECT_EQ(choice.at("token_ids"), want.at("output_ids"));
  EXPECT_EQ(choice.at("routed_experts").at("layers"), want.at("moe_layers"));
  EXPECT_EQ(base64_int32(choice.at("routed_experts").at("data").get<std::string>()), rows);
}

// The value of a sample line `name value` of a Prometheus text page.
double metric_value(const std::string& page, const std::string& name) {
  const auto at = page.find("\n" + name + " ");
  EXPECT_NE(at, std::string::npos) << "no " << name;
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + name.size() + 2));
}

TEST(HttpServer, MetricsCountWhatWasServed) {
  Served s;
  auto c = s.client();
  post(c, "/generate", R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3, "ignore_eos": true},
                          "return_routed_experts": true})", 200);
  post(c, "/v1/completions", R"({"prompt": [4, 5], "max_tokens": 4, "temperature": 0, "ignore_eos": true})", 200);
  const auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const std::string& page = res->body;
  EXPECT_EQ(metric_value(page, "r3:num_requests_running"), 0);
  EXPECT_EQ(metric_value(page, "r3:num_requests_waiting"), 0);
  EXPECT_EQ(metric_value(page, "r3:kv_cache_usage_perc"), 0);
  EXPECT_EQ(metric_value(page, "r3:request_success_total"), 2);
  EXPECT_EQ(metric_value(page, "r3:prompt_tokens_total"), 5);
  EXPECT_EQ(metric_value(page, "r3:generation_tokens_total"), 7);
  const auto& info = s.model().info();
  EXPECT_EQ(metric_value(page, "r3:routed_experts_bytes_total"),
            static_cast<double>((3 + 3 - 1) * static_cast<int64_t>(info.moe_layers.size()) * info.top_k * 4));
  EXPECT_EQ(metric_value(page, "r3:time_to_first_token_seconds_count"), 2);
  EXPECT_EQ(metric_value(page, "r3:e2e_request_latency_seconds_count"), 2);
  EXPECT_EQ(metric_value(page, "r3:inter_token_latency_seconds_count"), 2 + 3);  // one token per decode step
  EXPECT_NE(page.find("r3:e2e_request_latency_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(page.find("# TYPE r3:time_to_first_token_seconds histogram"), std::string::npos);
}

// Concurrent clients reach the engine together: more requests share a step than cpp-httplib's
// default worker pool (8 threads) would let through, and each gets its own answer.
TEST(HttpServer, ConcurrentClientsAreBatchedTogether) {
  engine::EngineOptions engine_options;
  engine_options.scheduler.max_running = 32;
  Served s({}, engine_options);
  constexpr int kClients = 24;
  std::vector<std::thread> clients;
  std::vector<json> answers(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto c = s.client();
      answers[static_cast<std::size_t>(i)] =
          post(c, "/generate", json({{"input_ids", {i + 1, i + 2}},
                                     {"sampling_params", {{"max_new_tokens", 100}, {"ignore_eos", true}}}}).dump(), 200);
    });
  }
  for (auto& t : clients) t.join();
  for (const json& a : answers) EXPECT_EQ(a.at("output_ids").size(), 100u);
  EXPECT_GT(s.stats().max_batch_sequences, 8);
}

// `r3 serve --ep 4`: the prompts of a request spread over four expert-parallel ranks, and each
// comes back with the tokens and routed experts one rank gives it.
TEST(HttpServer, ExpertParallelRanksAnswerAsOneRank) {
  const std::string body = R"({"input_ids": [[3, 17, 42], [5, 6], [7, 8, 9, 10], [11], [12, 13]],
      "return_routed_experts": true, "sampling_params": {"max_new_tokens": 6, "ignore_eos": true}})";
  Served one;
  auto c1 = one.client();
  const json want = post(c1, "/generate", body, 200);
  engine::EngineOptions options;
  options.expert_parallel = 4;
  Served four({}, options);
  auto c4 = four.client();
  const json got = post(c4, "/generate", body, 200);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].at("output_ids"), want[i].at("output_ids")) << "prompt " << i;
    EXPECT_EQ(got[i].at("meta_info").at("routed_experts"), want[i].at("meta_info").at("routed_experts")) << "prompt " << i;
  }
  EXPECT_GT(four.stats().expert_rows_exchanged, 0);
  const auto res = c4.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(metric_value(res->body, "r3:expert_rows_exchanged_total"),
            static_cast<double>(four.stats().expert_rows_exchanged));
  // No EPLB here: no weights moved, and the counter says so.
  EXPECT_EQ(metric_value(res->body, "r3:expert_weight_bytes_moved_total"), 0.0);
}

// A full waiting queue is a 503 (retry later), not an ever-growing queue; the prompts of the
// request that were taken end with it.
TEST(HttpServer, AFullQueueIs503) {
  engine::EngineOptions engine_options;
  engine_options.scheduler.max_running = 1;
  engine_options.scheduler.max_waiting = 1;
  Served s({}, engine_options);
  auto c = s.client();
  const json e = post(c, "/generate", R"({"input_ids": [[1, 2], [3, 4], [5, 6]],
                                         "sampling_params": {"max_new_tokens": 200, "ignore_eos": true}})", 503);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("waiting queue is full"), std::string::npos) << e.dump();
  EXPECT_EQ(e["error"]["type"], "ServiceUnavailableError");
  // The server is free again once those are ended.
  post(c, "/generate", R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})", 200);
}

// A request's prompts are admitted together or refused together, by the queues as they are when
// the request arrives: three prompts do not fit two waiting places, even though the first would
// be running (and the third would fit) after a step. Submitted one by one, with the engine
// stepping between them, the first could be running when the third came and all three be
// served: whether a batch fitted would depend on how fast the engine stepped.
TEST(HttpServer, ABatchIsAdmittedOrRefusedWhole) {
  engine::EngineOptions engine_options;
  engine_options.scheduler.max_running = 1;
  engine_options.scheduler.max_waiting = 2;
  Served s({}, engine_options);
  auto c = s.client();
  const std::string three = R"({"input_ids": [[1, 2], [3, 4], [5, 6]],
                                "sampling_params": {"max_new_tokens": 50, "ignore_eos": true}})";
  for (int attempt = 0; attempt < 3; ++attempt) {
    const json e = post(c, "/generate", three, 503);
    EXPECT_NE(e["error"]["message"].get<std::string>().find("waiting queue is full (2 of 2"), std::string::npos)
        << e.dump();
  }
  const json two = post(c, "/generate", R"({"input_ids": [[1, 2], [3, 4]], "sampling_params": {"max_new_tokens": 3}})",
                        200);
  ASSERT_EQ(two.size(), 2u);
  for (const json& answer : two) EXPECT_EQ(answer["output_ids"].size(), 3u);
}

TEST(HttpServer, BodiesOverTheLimitAre413) {
  server::ServerOptions options;
  options.max_body_bytes = 1000;
  Served s(options);
  auto c = s.client();
  std::string big = R"({"input_ids": [)";
  for (int i = 0; i < 500; ++i) big += "1,";
  big += "1]}";
  const auto res = c.Post("/generate", big, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], 413);
}

TEST(HttpServer, TheApiKeyGuardsEverythingButHealth) {
  server::ServerOptions options;
  options.api_key = "s3cret";
  Served s(options);
  auto c = s.client();
  const std::string body = R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})";
  EXPECT_EQ(post(c, "/generate", body, 401)["error"]["code"], 401);
  post(c, "/generate", body, 401, {{"Authorization", "Bearer wrong"}});
  post(c, "/generate", body, 401, {{"Authorization", "s3cret"}});
  post(c, "/generate", body, 200, {{"Authorization", "Bearer s3cret"}});
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_TRUE(server::equal_in_constant_time("abc", "abc"));
  EXPECT_FALSE(server::equal_in_constant_time("abc", "abd"));
  EXPECT_FALSE(server::equal_in_constant_time("abc", "abcd"));
  EXPECT_FALSE(server::equal_in_constant_time("", "a"));
}

// The r3 binary: `r3 serve --port 0` logs the port it got, answers over HTTP, and on SIGTERM
// finishes the request in flight (a stream of 32 samples run one at a time) and exits 0.
TEST(ServeCommand, ServesUntilSigterm) {
  TempDir tmp;
  const std::string log = tmp.path("serve.log");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    const std::string model = family_dir("qwen3_moe");
    execl(R3_BINARY, R3_BINARY, "serve", "--model", model.c_str(), "--port", "0", "--threads", "1",
          "--max-running", "1", "--shutdown-timeout", "600", static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {  // up to a minute for the load
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string prefix = "on http://127.0.0.1:";
    const auto at = text.find(prefix);
    if (at != std::string::npos && at + prefix.size() < text.size() && std::isdigit(static_cast<unsigned char>(text[at + prefix.size()]))) {
      port = std::stoi(text.substr(at + prefix.size()));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_GT(port, 0) << "no port in the log";
  httplib::Client c("127.0.0.1", port);
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json r = post(c, "/generate", R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})", 200);
  EXPECT_EQ(r.at("output_ids").size(), 2u);
  RawConnection in_flight(port);
  in_flight.send_all(raw_post("/v1/completions", R"({"prompt": [1, 2], "n": 32, "max_tokens": 200,
                                                    "ignore_eos": true, "stream": true})"));
  ASSERT_NE(in_flight.read_until("data: ").find("data: "), std::string::npos);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const std::string stream = in_flight.read_to_end();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  int finished = 0;
  for (const json& event : sse_events(stream)) {
    for (const json& choice : event.at("choices")) {
      if (choice.at("finish_reason").is_null()) continue;
      EXPECT_EQ(choice.at("finish_reason"), "length");
      ++finished;
    }
  }
  EXPECT_EQ(finished, 32);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace r3::test
