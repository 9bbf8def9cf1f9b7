// One client request to an engine endpoint (/generate, /v1/completions) while the engine runs
// it: its prompts submitted as one group, and their outputs gathered from the engine thread for
// the connection that answers. The engine thread only hands outputs over and wakes the
// connection; the answer (or each batch of stream events) is formatted by whoever takes it, off
// the engine thread. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/model_info.h"
#include "server/engine_loop.h"
#include "server/http_message.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/sglang_api.h"

namespace r3::server {

class EngineCall : public std::enable_shared_from_this<EngineCall> {
 public:
  // What the call answers in, and what formatting needs besides the outputs.
  struct Format {
    const models::ModelInfo* info = nullptr;
    std::string model_name;
    // The first of the numbers reserved for the call, one per prompt: /generate's ids are
    // theirs; /v1/completions' id is "cmpl-" and the first.
    int64_t number = 0;
    int64_t created = 0;
  };

  // wake: called from any thread (the engine's, or the submitter's) whenever the call has
  // something new to take; it must only schedule the taking.
  EngineCall(GenerateRequest request, Format format, ServerMetrics& metrics, std::function<void()> wake);
  EngineCall(CompletionRequest request, Format format, ServerMetrics& metrics, std::function<void()> wake);

  // Hands the prompts to the engine (EngineLoop::submit_all_async); the acceptance or refusal
  // comes later, through wake.
  void submit(EngineLoop& loop);

  bool streamed() const { return completion_ && completion_->stream; }
  // Whether there is something to take: a refusal, the whole answer, or (streamed) new events or
  // the stream's end.
  bool ready() const;
  // A refusal (the engine's reason: 400, or 503 with Retry-After for a full queue), once ready.
  std::optional<HttpAnswer> refusal() const;
  // Not streamed: the answer, once ready and not refused.
  HttpAnswer answer();
  // Streamed: the events that came since the last call, as server-sent-event lines ("data: {...}\n\n",
  // "data: [DONE]\n\n" last); `ended` set when the stream is over with them.
  std::string take_events(bool& ended);
  // The client is gone: every prompt still running ends at the engine's next step (its KV freed).
  void abandon(const std::string& why);

 private:
  void on_output(std::size_t prompt, const engine::RequestOutput& out);
  void on_accepted(std::vector<engine::RequestId> ids, std::exception_ptr refusal);
  const std::vector<engine::RequestParams>& prompts() const;
  std::string completion_id() const { return "cmpl-" + std::to_string(format_.number); }

  std::optional<GenerateRequest> generate_;
  std::optional<CompletionRequest> completion_;
  Format format_;
  ServerMetrics& metrics_;
  std::function<void()> wake_;
  EngineLoop* loop_ = nullptr;

  mutable std::mutex mutex_;
  std::optional<HttpAnswer> refusal_;
  bool accepted_ = false, abandoned_ = false, answered_ = false;
  std::string abandon_reason_;
  std::vector<engine::RequestId> ids_;
  std::vector<RequestClock> clocks_;                                   // per prompt
  std::vector<std::vector<engine::RequestOutput>> outputs_;            // not streamed: per prompt
  std::deque<std::pair<std::size_t, engine::RequestOutput>> stream_;  // streamed: (prompt, output) not yet sent
  std::size_t unfinished_ = 0;
};

}  // namespace r3::server
