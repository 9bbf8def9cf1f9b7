// The serving engine on a thread of its own, for a server's request threads. engine::Engine is
// single-threaded by design (one step at a time, no locks in the hot path); this loop is the one
// thread that calls it. Request threads submit a request together with a sink, which receives
// every output of the request as it streams out of a step (on the engine thread, so it must only
// hand the output on), and may abort their requests, e.g. when a client goes away. The engine
// thread steps while there is work and sleeps otherwise.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace r3::server {

class EngineLoop {
 public:
  // Called on the engine thread with each output of the request, the last one with finished set.
  using Sink = std::function<void(const engine::RequestOutput&)>;

  explicit EngineLoop(engine::Engine& engine);
  // Stops the engine thread; requests still running end with an abort output first.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Hands the request to the engine thread and waits until the engine has accepted it (its id)
  // or refused it (the engine's r3::Error, rethrown here).
  engine::RequestId submit(engine::RequestParams params, Sink sink);
  // The requests of one client request (its prompts), sink i for request i, handed over
  // together: the engine thread submits them in one pass, no step between, so whether they fit
  // depends only on the queues when they arrive. Either every one is accepted (their ids, in
  // order) or none is: on the first refusal the ones accepted before it are aborted, their
  // sinks dropped (they hear nothing), and the refusal is rethrown here.
  std::vector<engine::RequestId> submit_all(std::vector<engine::RequestParams> params, std::vector<Sink> sinks);
  // submit_all without the wait, for an event loop: `accepted` is called on the engine thread
  // with the ids, or with the refusal (ids empty, `refusal` set), before any sink hears anything.
  using Accepted = std::function<void(std::vector<engine::RequestId> ids, std::exception_ptr refusal)>;
  void submit_all_async(std::vector<engine::RequestParams> params, std::vector<Sink> sinks, Accepted accepted);
  // Ends the request at the engine's next step (its sink gets the abort); unknown or finished
  // ids are ignored.
  void abort(engine::RequestId id, const std::string& message = "aborted");
  // Ends every request the engine holds at its next step (a shutdown's grace period is over).
  void abort_every_request(const std::string& message);
  // The engine's counters after its latest step.
  engine::EngineStats stats() const;
  // The engine's options (fixed once it runs).
  const engine::EngineOptions& options() const { return engine_.options(); }

 private:
  struct Pending {
    std::vector<engine::RequestParams> params;
    std::vector<Sink> sinks;
    Accepted accepted;
  };
  void run();
  // Engine thread: the queued submissions and aborts handed to the engine.
  void take_queued();
  // Engine thread: each output to its request's sink (dropped once it has the last).
  void deliver(const std::vector<engine::RequestOutput>& outputs);
  // Copies the engine's statistics to where stats() reads them; called before outputs go out.
  void publish_stats();
  // Engine thread: every running request ends with `message` (a failed step, or shutdown).
  void abort_all(const std::string& message);

  engine::Engine& engine_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<std::pair<engine::RequestId, std::string>> aborts_;
  std::optional<std::string> abort_every_;  // abort_every_request's message, until the engine thread acts
  bool stopping_ = false;
  engine::EngineStats stats_;
  std::map<engine::RequestId, Sink> sinks_;  // engine thread only
  std::thread thread_;                       // last: starts once the rest exists
};

// Runs `params` through the loop and waits for it to finish: every output it produced, in order.
std::vector<engine::RequestOutput> run_to_completion(EngineLoop& loop, engine::RequestParams params);

}  // namespace r3::server
