// GET /metrics in Prometheus' text format, with names modeled on vLLM's: the engine's gauges
// (requests running and waiting, KV cache usage) read at scrape time, and the server's counters
// and latency histograms (time to first token, inter-token latency, end-to-end latency) updated
// as requests finish. Thread-safe: request threads record, the scraping thread renders.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace r3::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // The _bucket, _sum and _count lines of metric `name`.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// One finished request's figures.
struct RequestTiming {
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t routed_experts_bytes = 0;  // int32 ids returned (before base64)
  double time_to_first_token = -1;   // seconds; < 0: no token came out
  std::vector<double> inter_token;   // seconds between successive outputs with tokens
  double end_to_end = 0;
};

// One request's figures as its outputs arrive (on the engine thread, under the caller's lock):
// every sample's tokens and routed ids are counted, and each output that brings tokens is one
// step for the latency histograms.
class RequestClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RequestClock(int64_t prompt_tokens, Clock::time_point submitted = Clock::now());
  void observe(const engine::RequestOutput& out, Clock::time_point now = Clock::now());
  const RequestTiming& timing() const { return timing_; }

 private:
  RequestTiming timing_;
  Clock::time_point submitted_, last_tokens_;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void record(const RequestTiming& timing);
  // Everything, with the engine's gauges from `stats` (block_size: tokens per prefix-cache block).
  std::string render(const engine::EngineStats& stats, int64_t block_size) const;

 private:
  mutable std::mutex mutex_;
  int64_t requests_ = 0, prompt_tokens_ = 0, generation_tokens_ = 0, routed_bytes_ = 0;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace r3::server
