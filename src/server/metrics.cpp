#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace r3::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();  // le: value <= bound
  ++counts_[static_cast<std::size_t>(bucket)];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  int64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return out;
}

RequestClock::RequestClock(int64_t prompt_tokens, Clock::time_point submitted) : submitted_(submitted) {
  timing_.prompt_tokens = prompt_tokens;
}

void RequestClock::observe(const engine::RequestOutput& out, Clock::time_point now) {
  const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  bool tokens = false;
  for (const auto& sample : out.samples) {
    tokens = tokens || !sample.token_ids.empty();
    timing_.generation_tokens += static_cast<int64_t>(sample.token_ids.size());
    timing_.routed_experts_bytes += static_cast<int64_t>(sample.routed_experts.size() * sizeof(int32_t));
  }
  if (tokens) {
    if (timing_.time_to_first_token < 0) timing_.time_to_first_token = seconds(now - submitted_);
    else timing_.inter_token.push_back(seconds(now - last_tokens_));
    last_tokens_ = now;
  }
  if (out.finished) timing_.end_to_end = seconds(now - submitted_);
}

// vLLM's buckets.
ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0}) {}

void ServerMetrics::record(const RequestTiming& t) {
  std::lock_guard lock(mutex_);
  ++requests_;
  prompt_tokens_ += t.prompt_tokens;
  generation_tokens_ += t.generation_tokens;
  routed_bytes_ += t.routed_experts_bytes;
  if (t.time_to_first_token >= 0) ttft_.observe(t.time_to_first_token);
  for (const double gap : t.inter_token) itl_.observe(gap);
  e2e_.observe(t.end_to_end);
}

std::string ServerMetrics::render(const engine::EngineStats& stats, int64_t block_size) const {
  std::lock_guard lock(mutex_);
  const double usage = stats.kv_blocks_total > 0
                           ? 1.0 - static_cast<double>(stats.kv_blocks_free) / static_cast<double>(stats.kv_blocks_total)
                           : 0.0;
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  metric("r3:num_requests_running", "gauge", "Sequences in the engine's running batch.", stats.running);
  metric("r3:num_requests_waiting", "gauge", "Sequences waiting for admission.", stats.waiting);
  metric("r3:kv_cache_usage_perc", "gauge", "Share of KV cache blocks in use (1 = full).", usage);
  metric("r3:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", prompt_tokens_);
  metric("r3:generation_tokens_total", "counter", "Generated tokens of finished requests.", generation_tokens_);
  metric("r3:request_success_total", "counter", "Requests answered.", requests_);
  metric("r3:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.",
         stats.prefix_blocks_looked_up * block_size);
  metric("r3:prefix_cache_hits", "counter", "Prompt tokens served by the prefix cache.",
         stats.prefix_blocks_hit * block_size);
  metric("r3:routed_experts_bytes_total", "counter", "Bytes of routed expert ids returned (int32, before base64).",
         routed_bytes_);
  metric("r3:expert_rows_exchanged_total", "counter",
         "Expert parallelism: (token, choice) rows sent to another rank's experts.", stats.expert_rows_exchanged);
  metric("r3:expert_weight_bytes_moved_total", "counter",
         "Expert parallelism: bytes of expert weights EPLB moved from one rank to another.",
         stats.expert_weight_bytes_moved);
  out += "# HELP r3:time_to_first_token_seconds Time from submission to the first token.\n";
  out += "# TYPE r3:time_to_first_token_seconds histogram\n" + ttft_.render("r3:time_to_first_token_seconds");
  out += "# HELP r3:inter_token_latency_seconds Time between outputs of a request.\n";
  out += "# TYPE r3:inter_token_latency_seconds histogram\n" + itl_.render("r3:inter_token_latency_seconds");
  out += "# HELP r3:e2e_request_latency_seconds Time from submission to the last output.\n";
  out += "# TYPE r3:e2e_request_latency_seconds histogram\n" + e2e_.render("r3:e2e_request_latency_seconds");
  return out;
}

}  // namespace r3::server
