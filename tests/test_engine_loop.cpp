// The engine on its own thread (server/engine_loop.h): requests submitted from many threads at
// once get exactly what the same requests get from an engine driven directly (the engine's
// serving exactness makes that the reference), refusals come back to the submitting thread with
// the engine's reason, aborts from another thread end a request, and shutting down with
// requests running ends each of them with an abort rather than leaving a waiter hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/engine.h"
#include "models/registry.h"
#include "server/engine_loop.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

using engine::FinishReason;
using engine::RequestOutput;

// The tokens and the final output's routed experts of one request's outputs.
EngineResult gathered(const std::vector<RequestOutput>& outputs) {
  EngineResult r;
  for (const auto& out : outputs) {
    for (const auto& s : out.samples) {
      r.tokens.insert(r.tokens.end(), s.token_ids.begin(), s.token_ids.end());
      if (s.finish != FinishReason::kNone) {
        r.finish = s.finish;
        r.routed = s.routed_experts;
        r.abort_message = s.abort_message;
      }
    }
  }
  return r;
}

TEST(EngineLoop, RequestsFromManyThreadsGetWhatADirectEngineGives) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  const auto prompts = engine_prompts(16, model->info().vocab_size, 11);
  std::vector<EngineResult> direct;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    engine::Engine e(*model, ctx, {});
    e.submit(greedy_request(prompts[i], 3 + static_cast<int64_t>(i % 5)));
    direct.push_back(engine_run_all(e).begin()->second);
  }
  engine::EngineOptions options;
  options.scheduler.max_running = 8;
  engine::Engine served(*model, ctx, options);
  std::vector<EngineResult> results(prompts.size());
  {
    server::EngineLoop loop(served);
    std::vector<std::thread> clients;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      clients.emplace_back([&, i] {
        results[i] = gathered(server::run_to_completion(loop, greedy_request(prompts[i], 3 + static_cast<int64_t>(i % 5))));
      });
    }
    for (auto& c : clients) c.join();
    EXPECT_GT(loop.stats().max_batch_sequences, 1) << "the requests never shared a step";
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(results[i].finish, FinishReason::kLength) << "request " << i;
    EXPECT_EQ(results[i].tokens, direct[i].tokens) << "request " << i;
    EXPECT_EQ(results[i].routed, direct[i].routed) << "request " << i;
  }
  EXPECT_EQ(served.stats().kv_blocks_free, served.stats().kv_blocks_total);
}

TEST(EngineLoop, RefusalsReachTheSubmitterAndAbortsEndRequests) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  engine::Engine served(*model, ctx, {});
  server::EngineLoop loop(served);
  EXPECT_EQ(error_of([&] { loop.submit(greedy_request({1, 320}, 5), [](const RequestOutput&) {}); }),
            "prompt token id 320 is outside the vocabulary [0, 320)");
  // A long request, aborted from this thread once its first token has come out.
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<RequestOutput> outputs;
  const engine::RequestId id = loop.submit(greedy_request({1, 2, 3}, 200), [&](const RequestOutput& out) {
    std::lock_guard lock(mutex);
    outputs.push_back(out);
    changed.notify_all();
  });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return !outputs.empty(); });
  }
  loop.abort(id, "client went away");
  std::unique_lock lock(mutex);
  changed.wait(lock, [&] { return outputs.back().finished; });
  const EngineResult r = gathered(outputs);
  EXPECT_EQ(r.finish, FinishReason::kAbort);
  EXPECT_EQ(r.abort_message, "client went away");
  EXPECT_LT(r.tokens.size(), 200u);
}

// The statistics a request's last output is delivered with already count its end: an HTTP
// handler answers on that output, and the client's next /metrics must not show the request
// still running or its KV blocks still held (otherwise the server's metrics test can see both,
// rarely).
TEST(EngineLoop, StatsReadOnARequestsEndAlreadyCountIt) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  engine::Engine served(*model, ctx, {});
  server::EngineLoop loop(served);
  std::optional<engine::EngineStats> at_end;
  std::mutex mutex;
  std::condition_variable ended;
  loop.submit(greedy_request({4, 5}, 3), [&](const RequestOutput& out) {
    if (!out.finished) return;
    std::lock_guard lock(mutex);
    at_end = loop.stats();
    ended.notify_all();
  });
  std::unique_lock lock(mutex);
  ended.wait(lock, [&] { return at_end.has_value(); });
  EXPECT_EQ(at_end->running, 0);
  EXPECT_EQ(at_end->waiting, 0);
  EXPECT_EQ(at_end->kv_blocks_free, at_end->kv_blocks_total);
}

TEST(EngineLoop, ShuttingDownEndsRunningRequestsWithAnAbort) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  engine::Engine served(*model, ctx, {});
  std::atomic<bool> ended{false};
  std::string message;
  {
    server::EngineLoop loop(served);
    loop.submit(greedy_request({5, 6, 7}, 250), [&](const RequestOutput& out) {
      if (!out.finished) return;
      for (const auto& s : out.samples) message = s.abort_message;
      ended = true;
    });
  }  // destroyed while the request runs
  EXPECT_TRUE(ended);
  EXPECT_EQ(message, "the server is shutting down");
  EXPECT_FALSE(served.has_work());
}

}  // namespace
}  // namespace r3::test
