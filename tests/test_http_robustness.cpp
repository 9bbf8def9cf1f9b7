// `r3 serve`'s HTTP layer under what clients do wrong or too much, over loopback: wrong methods
// (405), oversized headers (431), a client leaving mid-stream, a graceful shutdown with and
// without enough grace, a load of 64 concurrent clients, and thousands of mutated requests.
#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "served_model.h"
#include "test_support.h"

namespace r3::test {
namespace {

using nlohmann::json;

TEST(HttpRobustness, AKnownPathWithTheWrongMethodIs405) {
  Served s;
  auto c = s.client();
  const auto get_generate = c.Get("/generate");
  ASSERT_TRUE(get_generate);
  EXPECT_EQ(get_generate->status, 405);
  EXPECT_EQ(get_generate->get_header_value("Allow"), "POST");
  const json e = json::parse(get_generate->body);
  EXPECT_EQ(e["error"]["code"], 405);
  EXPECT_EQ(e["error"]["message"], "/generate takes POST, not GET");
  const auto post_health = c.Post("/health", "{}", "application/json");
  ASSERT_TRUE(post_health);
  EXPECT_EQ(post_health->status, 405);
  EXPECT_EQ(post_health->get_header_value("Allow"), "GET");
  const auto delete_completions = c.Delete("/v1/completions");
  ASSERT_TRUE(delete_completions);
  EXPECT_EQ(delete_completions->status, 405);
  const auto unknown = c.Get("/v1/chat");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

TEST(HttpRobustness, TooManyOrTooLargeHeadersAreRefused) {
  server::ServerOptions options;
  options.max_header_fields = 20;
  options.max_header_bytes = 4096;
  Served s(options);
  auto c = s.client();
  const std::string body = R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})";
  httplib::Headers many;
  for (int i = 0; i < 30; ++i) many.emplace("X-Field-" + std::to_string(i), "v");
  const json e = post(c, "/generate", body, 431, many);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("header fields; the server accepts 20"), std::string::npos)
      << e.dump();
  EXPECT_EQ(e["error"]["type"], "RequestHeaderFieldsTooLargeError");
  httplib::Headers large;
  for (int i = 0; i < 5; ++i) large.emplace("X-Large-" + std::to_string(i), std::string(1000, 'a'));
  post(c, "/generate", body, 431, large);
  // One header line longer than all the headers may be: a 431 once the limit is passed, the rest
  // of the line never read.
  RawConnection raw(s.port());
  ASSERT_TRUE(raw.connected());
  raw.send_all("GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(20000, 'b') + "\r\n\r\n");
  const std::string answer = raw.read_to_end(30);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
  // And the server is still there, within the limits.
  post(c, "/generate", body, 200);
}

// A streamed request of many samples, run one at a time: long enough to still be running when
// its client leaves or the server is told to stop.
std::string long_stream_request() {
  return raw_post("/v1/completions", R"({"prompt": [1, 2], "n": 32, "max_tokens": 200, "ignore_eos": true,
                                         "temperature": 1, "seed": 5, "stream": true})");
}

engine::EngineOptions one_sequence_at_a_time() {
  engine::EngineOptions o;
  o.scheduler.max_running = 1;
  return o;
}

// Waits up to a minute for the engine to hold no request.
bool engine_goes_idle(const Served& s) {
  for (int i = 0; i < 600; ++i) {
    const auto st = s.stats();
    if (st.running == 0 && st.waiting == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(HttpRobustness, AClientLeavingMidStreamEndsItsRequests) {
  Served s({}, one_sequence_at_a_time());
  {
    RawConnection raw(s.port());
    ASSERT_TRUE(raw.connected());
    raw.send_all(long_stream_request());
    const std::string first = raw.read_until("data: ");
    ASSERT_NE(first.find("data: "), std::string::npos) << first;
  }  // gone, with 32 x 200 tokens to come
  ASSERT_TRUE(engine_goes_idle(s));
  // It ended early: far fewer tokens than the request asked for were generated.
  EXPECT_LT(s.stats().decode_tokens, 32 * 200 / 2);
  // The server goes on serving.
  auto c = s.client();
  EXPECT_EQ(post(c, "/generate", R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}})", 200)
                .at("output_ids")
                .size(),
            3u);
}

// Each choice's finish reason in a stream, by index.
std::map<int, std::string> finish_reasons(const std::string& stream) {
  std::map<int, std::string> reasons;
  for (const json& event : sse_events(stream)) {
    for (const json& choice : event.at("choices")) {
      if (!choice.at("finish_reason").is_null()) reasons[choice.at("index").get<int>()] = choice.at("finish_reason");
    }
  }
  return reasons;
}

TEST(HttpRobustness, AShutdownLetsTheRequestsInFlightFinishAndRefusesNewConnections) {
  Served s({}, one_sequence_at_a_time());
  RawConnection raw(s.port());
  ASSERT_TRUE(raw.connected());
  raw.send_all(long_stream_request());
  ASSERT_NE(raw.read_until("data: ").find("data: "), std::string::npos);
  std::thread stopper([&] { s.server().shutdown(std::chrono::seconds(600)); });
  while (s.server().running()) std::this_thread::yield();
  EXPECT_FALSE(RawConnection(s.port()).connected()) << "a connection was accepted after the shutdown began";
  const std::string stream = raw.read_to_end();
  stopper.join();
  const auto reasons = finish_reasons(stream);
  ASSERT_EQ(reasons.size(), 32u);
  for (const auto& [index, reason] : reasons) EXPECT_EQ(reason, "length") << "choice " << index;
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
}

TEST(HttpRobustness, AShutdownEndsTheRequestsThatOutliveItsGrace) {
  Served s({}, one_sequence_at_a_time());
  RawConnection raw(s.port());
  ASSERT_TRUE(raw.connected());
  raw.send_all(long_stream_request());
  ASSERT_NE(raw.read_until("data: ").find("data: "), std::string::npos);
  s.server().shutdown(std::chrono::milliseconds(0));
  const std::string stream = raw.read_to_end();
  const auto reasons = finish_reasons(stream);
  ASSERT_EQ(reasons.size(), 32u) << "every choice ends, aborted or not";
  int aborted = 0;
  for (const auto& [index, reason] : reasons) aborted += reason == "abort";
  EXPECT_GT(aborted, 0);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  EXPECT_TRUE(engine_goes_idle(s));
}

// 64 clients send 2,000 requests between them, both endpoints, and every answer is complete.
TEST(HttpRobustness, SixtyFourClientsTwoThousandRequestsNoErrors) {
  constexpr int kClients = 64, kRequests = 2000, kTokens = 8;
  server::ServerOptions options;
  options.worker_threads = 2 * kClients + 16;  // as r3 serve sizes it
  engine::EngineOptions engine_options;
  engine_options.scheduler.max_running = kClients;
  Served s(options, engine_options);
  std::atomic<int> next{0}, complete{0};
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  const auto fail = [&](const std::string& what) {
    std::lock_guard lock(failures_mutex);
    failures.push_back(what);
  };
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&] {
      auto c = s.client();
      for (int i = next++; i < kRequests; i = next++) {
        const std::vector<int> prompt = {1 + i % 300, 1 + (i * 7) % 300, 1 + (i * 13) % 300};
        const bool sglang = i % 2 == 0;
        const json body = sglang ? json{{"input_ids", prompt},
                                        {"sampling_params", {{"max_new_tokens", kTokens}, {"ignore_eos", true}}}}
                                 : json{{"prompt", prompt}, {"max_tokens", kTokens}, {"ignore_eos", true}};
        const auto res = c.Post(sglang ? "/generate" : "/v1/completions", body.dump(), "application/json");
        if (!res) {
          fail("request " + std::to_string(i) + ": " + httplib::to_string(res.error()));
          continue;
        }
        if (res->status != 200) {
          fail("request " + std::to_string(i) + ": " + std::to_string(res->status) + " " + res->body);
          continue;
        }
        const json r = json::parse(res->body);
        const json& ids = sglang ? r.at("output_ids") : r.at("choices").at(0).at("token_ids");
        if (ids.size() == kTokens) ++complete;
        else fail("request " + std::to_string(i) + ": " + std::to_string(ids.size()) + " tokens");
      }
    });
  }
  for (auto& t : clients) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, the first: " << failures.front();
  EXPECT_EQ(complete.load(), kRequests);
  EXPECT_GT(s.stats().max_batch_sequences, 16) << "the clients were not batched together";
  std::printf("[ load ] %d clients, %d requests of %d tokens in %.2f s (%.0f requests/s), largest step %ld sequences\n",
              kClients, kRequests, kTokens, seconds, kRequests / seconds,
              static_cast<long>(s.stats().max_batch_sequences));
}

// A seeded generator of bad requests: valid ones mutated byte by byte or field by field. The
// server answers every one, with a 200 or a JSON error whose code is the status, and stays up.
class RequestMutator {
 public:
  explicit RequestMutator(uint32_t seed) : rng_(seed) {}

  // (path, body)
  std::pair<std::string, std::string> next() {
    const json& base = bases()[pick(bases().size())];
    const std::string path = base.contains("input_ids") ? "/generate" : "/v1/completions";
    switch (pick(4)) {
      case 0: return {path, mutate_bytes(base.dump())};
      case 1: return {path, text(mutate_fields(base))};
      case 2: return {path, mutate_bytes(text(mutate_fields(base)))};
      default: return {pick(2) ? "/generate" : "/v1/completions", text(mutate_fields(base))};  // the other shape
    }
  }

 private:
  static const std::vector<json>& bases() {
    static const std::vector<json> all = {
        json::parse(R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0.7,
                       "top_p": 0.9, "top_k": 5, "seed": 3, "stop_token_ids": [7]}, "return_logprob": true,
                       "return_routed_experts": true, "routed_experts_start_len": 1})"),
        json::parse(R"({"input_ids": [[4, 5], [6]], "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}})"),
        json::parse(R"({"prompt": [9, 8, 7], "max_tokens": 4, "n": 2, "logprobs": 2, "seed": 1,
                       "return_token_ids": true, "return_tokens_as_token_ids": true, "return_routed_experts": true,
                       "routed_experts_start": 0, "stop_token_ids": [3], "top_k": 4, "top_p": 0.5})"),
        json::parse(R"({"prompt": [[1, 2], [3]], "max_tokens": 3, "stream": true,
                       "stream_options": {"include_usage": true}})"),
        json::parse(R"({"prompt": [1, 2, 3], "max_tokens": 2, "replay_routed_experts":
                       [[[0, 1]], [[2, 3]], [[4, 5]]]})"),
    };
    return all;
  }

  // Invalid UTF-8 in a string value goes out as replacement characters (the byte mutations send raw bytes).
  static std::string text(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  json random_value() {
    switch (pick(14)) {
      case 0: return nullptr;
      case 1: return true;
      case 2: return -1;
      case 3: return 0;
      case 4: return 319;
      case 5: return 320;
      case 6: return int64_t{1} << 40;
      case 7: return -1e308;
      case 8: return 0.5;
      case 9: return "x\xff\xfe";
      case 10: return json::array({1, json::array({2, json::array({3})})});
      case 11: return json::object({{"a", 1}});
      case 12: return json::array();
      default: return json(std::vector<int>(pick(300), static_cast<int>(pick(400))));
    }
  }

  // Replaces, removes or adds one field somewhere in the object tree.
  json mutate_fields(json body) {
    json* at = &body;
    while (at->is_object() && !at->empty() && pick(3) != 0) {
      auto it = at->begin();
      std::advance(it, static_cast<long>(pick(at->size())));
      if (!it->is_object()) {
        if (pick(2)) *it = random_value();
        else at->erase(it);
        return body;
      }
      at = &*it;
    }
    if (at->is_object()) (*at)[pick(2) ? "unknown_field" : "n"] = random_value();
    return body;
  }

  std::string mutate_bytes(std::string text) {
    const std::size_t edits = 1 + pick(4);
    for (std::size_t e = 0; e < edits && !text.empty(); ++e) {
      const std::size_t at = pick(text.size());
      switch (pick(4)) {
        case 0: text[at] = static_cast<char>(pick(256)); break;
        case 1: text.erase(at, 1 + pick(8)); break;
        case 2: text.insert(at, 1, "{}[]\",:0-e\\"[pick(11)]); break;
        default: text.resize(at); break;
      }
    }
    return text;
  }

  std::mt19937 rng_;
};

TEST(HttpRobustness, ThousandsOfMutatedRequestsAllGetAnAnswer) {
  constexpr int kRequests = 3000, kThreads = 8;
  Served s;
  std::atomic<int> next{0}, ok{0}, refused{0};
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      RequestMutator mutator(static_cast<uint32_t>(1234 + t));
      auto c = s.client();
      for (int i = next++; i < kRequests; i = next++) {
        const auto [path, body] = mutator.next();
        const auto res = c.Post(path, body, "application/json");
        std::string problem;
        if (!res) {
          problem = "no answer: " + httplib::to_string(res.error());
        } else if (res->status == 200) {
          if (res->get_header_value("Content-Type").find("text/event-stream") != std::string::npos) {
            if (res->body.find("data: [DONE]") == std::string::npos) problem = "a stream without [DONE]";
          } else if (!json::accept(res->body)) {
            problem = "a 200 without JSON";
          }
          ++ok;
        } else {
          const json e = json::parse(res->body, nullptr, false);
          if (e.is_discarded() || !e.contains("error") || e["error"]["code"] != res->status ||
              !e["error"]["message"].is_string() || res->status >= 500) {
            problem = "status " + std::to_string(res->status) + " with " + res->body;
          }
          ++refused;
        }
        if (!problem.empty()) {
          std::lock_guard lock(failures_mutex);
          failures.push_back(problem + " for " + path + " " + json(body).dump(-1, ' ', false, json::error_handler_t::replace));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " bad answers, the first: " << failures.front();
  EXPECT_EQ(ok + refused, kRequests);
  // Both kinds happened: the mutations are neither all harmless nor all fatal.
  EXPECT_GT(ok.load(), kRequests / 20);
  EXPECT_GT(refused.load(), kRequests / 4);
  std::printf("[ fuzz ] %d mutated requests: %d answered 200, %d refused with a JSON error\n", kRequests, ok.load(),
              refused.load());
  ASSERT_TRUE(engine_goes_idle(s));
  auto c = s.client();
  post(c, "/generate", R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})", 200);
}

}  // namespace
}  // namespace r3::test
