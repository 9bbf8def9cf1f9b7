#include "server/engine_loop.h"

#include <spdlog/spdlog.h>

#include "core/check.h"

namespace r3::server {

EngineLoop::EngineLoop(engine::Engine& engine) : engine_(engine), stats_(engine.stats()), thread_([this] { run(); }) {}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

engine::RequestId EngineLoop::submit(engine::RequestParams params, Sink sink) {
  std::vector<engine::RequestParams> one;
  one.push_back(std::move(params));
  std::vector<Sink> sinks;
  sinks.push_back(std::move(sink));
  return submit_all(std::move(one), std::move(sinks)).front();
}

std::vector<engine::RequestId> EngineLoop::submit_all(std::vector<engine::RequestParams> params,
                                                      std::vector<Sink> sinks) {
  auto accepted = std::make_shared<std::promise<std::vector<engine::RequestId>>>();
  std::future<std::vector<engine::RequestId>> answer = accepted->get_future();
  submit_all_async(std::move(params), std::move(sinks), [accepted](std::vector<engine::RequestId> ids,
                                                                   std::exception_ptr refusal) {
    if (refusal) accepted->set_exception(refusal);
    else accepted->set_value(std::move(ids));
  });
  return answer.get();  // rethrows the engine's refusal
}

void EngineLoop::submit_all_async(std::vector<engine::RequestParams> params, std::vector<Sink> sinks,
                                  Accepted accepted) {
  R3_CHECK(params.size() == sinks.size() && !params.empty(), "submit_all: ", params.size(), " requests and ",
           sinks.size(), " sinks");
  {
    std::lock_guard lock(mutex_);
    R3_CHECK(!stopping_, "the server is shutting down");
    pending_.push_back(Pending{std::move(params), std::move(sinks), std::move(accepted)});
  }
  wake_.notify_all();
}

void EngineLoop::abort(engine::RequestId id, const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    aborts_.emplace_back(id, message);
  }
  wake_.notify_all();
}

void EngineLoop::abort_every_request(const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    abort_every_ = message;
  }
  wake_.notify_all();
}

engine::EngineStats EngineLoop::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void EngineLoop::publish_stats() {
  const engine::EngineStats now = engine_.stats();
  std::lock_guard lock(mutex_);
  stats_ = now;
}

void EngineLoop::take_queued() {
  std::deque<Pending> pending;
  std::vector<std::pair<engine::RequestId, std::string>> aborts;
  std::optional<std::string> abort_every;
  {
    std::lock_guard lock(mutex_);
    pending.swap(pending_);
    aborts.swap(aborts_);
    abort_every.swap(abort_every_);
  }
  for (Pending& p : pending) {
    std::vector<engine::RequestId> ids;
    try {
      for (std::size_t i = 0; i < p.params.size(); ++i) {
        ids.push_back(engine_.submit(std::move(p.params[i])));
        sinks_[ids.back()] = std::move(p.sinks[i]);
      }
    } catch (...) {
      // None of the group runs: the ones accepted end at the next step, unheard.
      for (const engine::RequestId id : ids) {
        engine_.abort(id, "another prompt of the request was refused");
        sinks_.erase(id);
      }
      p.accepted({}, std::current_exception());
      continue;
    }
    p.accepted(std::move(ids), nullptr);
  }
  for (const auto& [id, message] : aborts) engine_.abort(id, message);
  // After the submissions: a request accepted just now ends too.
  if (abort_every) {
    for (const auto& [id, sink] : sinks_) engine_.abort(id, *abort_every);
  }
}

void EngineLoop::deliver(const std::vector<engine::RequestOutput>& outputs) {
  for (const auto& out : outputs) {
    const auto found = sinks_.find(out.id);
    if (found == sinks_.end()) continue;
    found->second(out);
    if (out.finished) sinks_.erase(found);
  }
}

void EngineLoop::abort_all(const std::string& message) {
  for (const auto& [id, sink] : sinks_) engine_.abort(id, message);
  // The aborts come out of the next step.
  try {
    const std::vector<engine::RequestOutput> outputs = engine_.step();
    publish_stats();
    deliver(outputs);
  } catch (const std::exception& e) {
    spdlog::error("server: ending the running requests failed too: {}", e.what());
  }
  // Whoever did not hear the end from the engine hears it here: nobody waits forever.
  for (const auto& [id, sink] : sinks_) {
    engine::RequestOutput out;
    out.id = id;
    out.finished = true;
    engine::SampleOutput& sample = out.samples.emplace_back();
    sample.finish = engine::FinishReason::kAbort;
    sample.abort_message = message;
    sink(out);
  }
  sinks_.clear();
}

void EngineLoop::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] {
        return stopping_ || !pending_.empty() || !aborts_.empty() || abort_every_ || engine_.has_work();
      });
      if (stopping_) break;
    }
    take_queued();
    if (!engine_.has_work()) continue;
    try {
      const std::vector<engine::RequestOutput> outputs = engine_.step();
      // Published before the outputs are: whoever hears that a request ended (and answers a
      // client, who may then read /metrics) sees statistics that already count that end.
      publish_stats();
      deliver(outputs);
    } catch (const std::exception& e) {
      spdlog::error("server: an engine step failed: {}", e.what());
      abort_all(std::string("the engine step failed: ") + e.what());
    }
  }
  // Shutdown: refuse what is still queued, end what runs.
  std::deque<Pending> pending;
  {
    std::lock_guard lock(mutex_);
    pending.swap(pending_);
  }
  for (Pending& p : pending) p.accepted({}, std::make_exception_ptr(Error("the server is shutting down")));
  if (!sinks_.empty()) abort_all("the server is shutting down");
}

std::vector<engine::RequestOutput> run_to_completion(EngineLoop& loop, engine::RequestParams params) {
  std::mutex mutex;
  std::condition_variable done;
  std::vector<engine::RequestOutput> outputs;
  bool finished = false;
  loop.submit(std::move(params), [&](const engine::RequestOutput& out) {
    std::lock_guard lock(mutex);
    outputs.push_back(out);
    finished = out.finished;
    if (finished) done.notify_all();
  });
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return finished; });
  return outputs;
}

}  // namespace r3::server
