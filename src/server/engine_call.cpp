#include "server/engine_call.h"

#include "core/check.h"
#include "server/api_error.h"

namespace r3::server {

EngineCall::EngineCall(GenerateRequest request, Format format, ServerMetrics& metrics, std::function<void()> wake)
    : generate_(std::move(request)), format_(std::move(format)), metrics_(metrics), wake_(std::move(wake)) {}

EngineCall::EngineCall(CompletionRequest request, Format format, ServerMetrics& metrics, std::function<void()> wake)
    : completion_(std::move(request)), format_(std::move(format)), metrics_(metrics), wake_(std::move(wake)) {}

const std::vector<engine::RequestParams>& EngineCall::prompts() const {
  return generate_ ? generate_->prompts : completion_->prompts;
}

void EngineCall::submit(EngineLoop& loop) {
  loop_ = &loop;
  const std::vector<engine::RequestParams>& all = prompts();
  std::vector<EngineLoop::Sink> sinks;
  {
    std::lock_guard lock(mutex_);
    for (const engine::RequestParams& p : all) clocks_.emplace_back(static_cast<int64_t>(p.prompt.size()));
    outputs_.resize(all.size());
    unfinished_ = all.size();
  }
  // The sinks hold the call alive until the engine has ended every prompt.
  const std::shared_ptr<EngineCall> self = shared_from_this();
  for (std::size_t p = 0; p < all.size(); ++p) {
    sinks.push_back([self, p](const engine::RequestOutput& out) { self->on_output(p, out); });
  }
  try {
    loop.submit_all_async(all, std::move(sinks), [self](std::vector<engine::RequestId> ids, std::exception_ptr refusal) {
      self->on_accepted(std::move(ids), refusal);
    });
  } catch (const Error& e) {  // the loop is stopping
    on_accepted({}, std::current_exception());
  }
}

void EngineCall::on_accepted(std::vector<engine::RequestId> ids, std::exception_ptr refusal) {
  bool abort_now = false;
  {
    std::lock_guard lock(mutex_);
    if (refusal) {
      std::string message = "the engine refused the request";
      try {
        std::rethrow_exception(refusal);
      } catch (const std::exception& e) {
        message = e.what();
      }
      // The engine's queue bound is the server's admission bound: beyond it, try again later.
      const bool queue_full = message.find("queue is full") != std::string::npos;
      const bool stopping = message.find("shutting down") != std::string::npos;
      refusal_ = error_answer(queue_full || stopping ? 503 : 400, message, generate_ ? "input_ids" : "prompt");
      if (queue_full) refusal_->headers.emplace_back("Retry-After", "1");
      if (stopping) refusal_->headers.emplace_back("Connection", "close");
    } else {
      accepted_ = true;
      ids_ = std::move(ids);
      abort_now = abandoned_;
    }
  }
  if (abort_now) {
    for (const engine::RequestId id : ids_) loop_->abort(id, abandon_reason_);
  }
  wake_();
}

void EngineCall::on_output(std::size_t prompt, const engine::RequestOutput& out) {
  {
    std::lock_guard lock(mutex_);
    clocks_[prompt].observe(out);
    if (streamed()) stream_.emplace_back(prompt, out);
    else outputs_[prompt].push_back(out);
    if (out.finished) --unfinished_;
  }
  wake_();
}

bool EngineCall::ready() const {
  std::lock_guard lock(mutex_);
  if (refusal_) return true;
  if (!accepted_ || answered_) return false;
  return streamed() ? !stream_.empty() || unfinished_ == 0 : unfinished_ == 0;
}

std::optional<HttpAnswer> EngineCall::refusal() const {
  std::lock_guard lock(mutex_);
  return refusal_;
}

HttpAnswer EngineCall::answer() {
  std::vector<std::vector<engine::RequestOutput>> outputs;
  {
    std::lock_guard lock(mutex_);
    R3_CHECK(accepted_ && unfinished_ == 0 && !answered_ && !streamed(), "answer: the call has no answer to give");
    answered_ = true;
    outputs.swap(outputs_);
    for (const RequestClock& clock : clocks_) metrics_.record(clock.timing());
  }
  const std::vector<engine::RequestParams>& all = prompts();
  if (generate_) {
    nlohmann::json answers = nlohmann::json::array();
    for (std::size_t p = 0; p < outputs.size(); ++p) {
      answers.push_back(generate_response(all[p], gather_sample(outputs[p]), *format_.info, generate_->return_logprob,
                                          std::to_string(format_.number + static_cast<int64_t>(p))));
    }
    return json_answer(200, generate_->batch ? answers : answers.front());
  }
  std::vector<std::vector<CompletedSample>> samples;
  for (std::size_t p = 0; p < outputs.size(); ++p) {
    auto& mine = samples.emplace_back();
    for (int64_t i = 0; i < all[p].n; ++i) mine.push_back(gather_sample(outputs[p], i));
  }
  return json_answer(200, completion_response(*completion_, samples, *format_.info, format_.model_name, completion_id(),
                                              format_.created));
}

std::string EngineCall::take_events(bool& ended) {
  std::deque<std::pair<std::size_t, engine::RequestOutput>> taken;
  ended = false;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  {
    std::lock_guard lock(mutex_);
    R3_CHECK(accepted_ && streamed() && !answered_, "take_events: the call streams nothing");
    taken.swap(stream_);
    if (unfinished_ == 0) {
      ended = answered_ = true;
      for (const RequestClock& clock : clocks_) {
        prompt_tokens += clock.timing().prompt_tokens;
        completion_tokens += clock.timing().generation_tokens;
        metrics_.record(clock.timing());
      }
    }
  }
  std::string events;
  const auto add = [&events](const nlohmann::json& event) { events += "data: " + json_text(event) + "\n\n"; };
  for (const auto& [prompt, out] : taken) {
    for (const engine::SampleOutput& sample : out.samples) {
      add(completion_chunk(*completion_, prompt, sample, *format_.info, format_.model_name, completion_id(),
                           format_.created));
    }
  }
  if (ended) {
    if (completion_->include_usage) {
      add({{"id", completion_id()}, {"object", "text_completion"}, {"created", format_.created},
           {"model", format_.model_name}, {"choices", nlohmann::json::array()},
           {"usage", usage_object(prompt_tokens, completion_tokens)}});
    }
    events += "data: [DONE]\n\n";
  }
  return events;
}

void EngineCall::abandon(const std::string& why) {
  std::vector<engine::RequestId> ids;
  {
    std::lock_guard lock(mutex_);
    if (abandoned_) return;
    abandoned_ = true;
    abandon_reason_ = why;
    if (accepted_ && unfinished_ > 0) ids = ids_;
  }
  for (const engine::RequestId id : ids) loop_->abort(id, why);
}

}  // namespace r3::server
