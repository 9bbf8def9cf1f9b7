// Bytes a decode step must read: the attention projections and router gates of every layer, the
// distinct experts the step routed to (counted per layer from its captured ids), lm_head, and
// every sequence's K/V (bf16, as the pools hold them) over its context. Floor = bytes / copy bandwidth. Each figure is
// the mean of 20 steps after 3 warm-up steps (the second captures the step's CUDA graph), on the
// host clock around forward_drawn: each step ends with its next tokens drawn on the device as an
// RL rollout draws them (temperature 1 over the whole vocabulary, the chosen token's logprob) and
// only those reach the host. logits_step_ms is the same step ending instead with the [batch, vocab]
// logits copied to page-locked host memory (forward_into), logits_copy_ms that copy alone, and
// host_draw_ms the same draws made from those logits on the host (engine::draw_on_host, one core).
// Before each step every sequence is set back to context - 1 cached positions (their values do not
// change the time).
// Capture's cost is measured on the same model, steps with and without it interleaved.
#include "cli/synthetic_bench.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "backend/device_memory.h"
#include "engine/host_draw.h"
#include "models/device_decoder.h"
#include "moe/device_experts.h"
#include "moe/routing_capturer.h"

namespace r3::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr int64_t kPrefillTokens = 4096;

class SyntheticBench {
 public:
  SyntheticBench(backend::Context& ctx, models::SyntheticShape shape, int64_t context)
      : ctx_(ctx), s_(shape), context_(context) {}

  // Decode steps of `batch` sequences at position context - 1 on one cache, with or without
  // capture (the model's capture switched to match).
  class DecodeSteps {
   public:
    DecodeSteps(backend::Context& ctx, models::CausalLM& model, const models::SyntheticShape& s, int64_t batch,
                int64_t context)
        : ctx_(ctx),
          model_(model),
          batch_(batch),
          context_(context),
          cache_(model.make_cache(batch, context + models::kSyntheticSparePositions)),
          capturer_(batch, s.layers, s.top_k, s.experts),
          logits_(backend::host_staging_empty(ctx, DType::F32, {batch, s.vocab})),
          draws_(static_cast<std::size_t>(batch)),
          drawn_(static_cast<std::size_t>(batch)) {
      for (int64_t b = 0; b < batch; ++b) {
        step_.token_ids.push_back(static_cast<int32_t>((b * 7919 + 11) % s.vocab));
        step_.positions.push_back(static_cast<int32_t>(context - 1));
        step_.seqs.push_back(static_cast<int32_t>(b));
        auto& draw = draws_[static_cast<std::size_t>(b)];
        draw.temperature = 1.0;
        draw.logprobs = 0;
        draw.uniform = static_cast<double>((b * 40503 + 17) % 65536) / 65536.0;
      }
    }
    // Mean milliseconds of `steps` steps, ending with tokens drawn on the device or (logits) with
    // the logits on the host.
    double run(int steps, bool capture, bool logits = false) {
      models::set_capture_routing(model_, capture);
      step_.capture = capture ? &capturer_ : nullptr;
      const bool drawn = !logits && model_.draws_tokens();
      const auto start = Clock::now();
      for (int i = 0; i < steps; ++i) {
        for (int64_t b = 0; b < batch_; ++b) cache_->set_length(b, context_ - 1);
        if (capture) capturer_.begin_step(batch_);
        if (drawn) model_.forward_drawn(ctx_, step_, *cache_, draws_, drawn_);
        else model_.forward_into(ctx_, step_, *cache_, logits_);
        if (capture) capturer_.end_step();
      }
      return seconds_since(start) * 1e3 / steps;
    }
    const moe::RoutingCapturer& capturer() const { return capturer_; }
    // Mean milliseconds of the copy each step ends with (its logits to the host), alone.
    double logits_copy_ms(int copies) {
      const Tensor on_device = backend::device_empty(ctx_, DType::F32, logits_.shape());
      backend::copy_to_host(ctx_, on_device, logits_);
      const auto start = Clock::now();
      for (int i = 0; i < copies; ++i) backend::copy_to_host(ctx_, on_device, logits_);
      return seconds_since(start) * 1e3 / copies;
    }
    // Mean milliseconds of the step's draws made on the host from its logits (after a logits step).
    double host_draw_ms(int repeats) {
      const auto vocab = static_cast<std::size_t>(logits_.dim(1));
      const auto start = Clock::now();
      for (int i = 0; i < repeats; ++i) {
        for (std::size_t b = 0; b < draws_.size(); ++b) {
          drawn_[b] = engine::draw_on_host({logits_.data<float>() + b * vocab, vocab}, draws_[b]);
        }
      }
      return seconds_since(start) * 1e3 / repeats;
    }

   private:
    backend::Context& ctx_;
    models::CausalLM& model_;
    int64_t batch_, context_;
    std::unique_ptr<models::ModelCache> cache_;
    models::ForwardBatch step_;
    moe::RoutingCapturer capturer_;
    Tensor logits_;
    std::vector<ops::TokenDraw> draws_;
    std::vector<ops::DrawnToken> drawn_;
  };

  // Mean step time with capture on (3 warm-up steps, the second captures the step's CUDA graph,
  // then 20), and the step's distinct experts per layer, summed over layers.
  // With logits: also the step that ends with its logits on the host, and that copy alone.
  struct LogitsPath {
    double step_ms, copy_ms, host_draw_ms;
  };
  double decode_ms(models::CausalLM& model, int64_t batch, double* distinct_sum, LogitsPath* logits = nullptr) const {
    DecodeSteps steps(ctx_, model, s_, batch, context_);
    steps.run(3, true);
    const double ms = steps.run(20, true);
    if (logits != nullptr) {
      steps.run(3, true, true);
      logits->step_ms = steps.run(20, true, true);
      logits->host_draw_ms = steps.host_draw_ms(3);
      logits->copy_ms = steps.logits_copy_ms(20);
    }
    if (distinct_sum != nullptr) {
      *distinct_sum = 0;
      for (int64_t l = 0; l < s_.layers; ++l) {
        std::set<int32_t> used;
        for (int64_t t = 0; t < batch; ++t) {
          for (int64_t c = 0; c < s_.top_k; ++c) used.insert(steps.capturer().id(t, l, c));
        }
        *distinct_sum += static_cast<double>(used.size());
      }
    }
    return ms;
  }

  struct CaptureCost {
    double on_ms, off_ms, overhead;  // medians over rounds
  };
  // Capture's cost, interleaved so that drift (clocks, temperature) falls on both alike: 7 rounds
  // of 10 steps with capture and 10 without (the order alternating), on one model and cache;
  // medians of the rounds' means and of their ratios.
  CaptureCost capture_cost(models::CausalLM& model, int64_t batch) const {
    DecodeSteps steps(ctx_, model, s_, batch, context_);
    steps.run(3, true);
    steps.run(3, false);
    std::vector<double> on, off, ratio;
    for (int round = 0; round < 7; ++round) {
      const bool on_first = round % 2 == 0;
      const double first = steps.run(10, on_first), second = steps.run(10, !on_first);
      on.push_back(on_first ? first : second);
      off.push_back(on_first ? second : first);
      ratio.push_back(on.back() / off.back() - 1.0);
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    steps.run(0, true);  // leave the model capturing
    return {median(on), median(off), median(ratio)};
  }

  // Bytes a decode step of `batch` sequences must read, given its distinct experts.
  double step_bytes(int64_t batch, double distinct_sum) const {
    const auto f = [](int64_t v) { return static_cast<double>(v); };
    const int64_t kv_width = s_.kv_heads * s_.head_dim;
    const int64_t q_width = s_.heads * s_.head_dim;
    const double attention = f(s_.matrix_bytes(q_width + 2 * kv_width, s_.hidden) + s_.matrix_bytes(s_.hidden, q_width));
    const double gate = 4.0 * f(s_.experts * s_.hidden);
    const double expert = f(2 * s_.matrix_bytes(s_.expert_width, s_.hidden) + s_.matrix_bytes(s_.hidden, s_.expert_width));
    const double lm_head = 2.0 * f(s_.vocab * s_.hidden);
    const double kv = 2.0 * 2.0 * f(batch * context_ * kv_width) * f(s_.layers);  // bf16 keys and values
    return f(s_.layers) * (attention + gate) + distinct_sum * expert + lm_head + kv;
  }

  // Best of 3 prefills of kPrefillTokens tokens in one step, in seconds.
  double prefill_seconds(models::CausalLM& model) const {
    auto cache = model.make_cache(1, kPrefillTokens);
    models::ForwardBatch step;
    for (int64_t t = 0; t < kPrefillTokens; ++t) {
      step.token_ids.push_back(static_cast<int32_t>((t * 7919 + 11) % s_.vocab));
      step.positions.push_back(static_cast<int32_t>(t));
      step.seqs.push_back(0);
    }
    step.logit_rows = {kPrefillTokens - 1};
    moe::RoutingCapturer capturer(kPrefillTokens, s_.layers, s_.top_k, s_.experts);
    step.capture = &capturer;
    Tensor logits = Tensor::empty(DType::F32, {1, s_.vocab});
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      cache->clear(0);
      capturer.begin_step(kPrefillTokens);
      const auto start = Clock::now();
      model.forward_into(ctx_, step, *cache, logits);
      best = std::min(best, seconds_since(start));
      capturer.end_step();
    }
    return best;
  }

 private:
  backend::Context& ctx_;
  models::SyntheticShape s_;
  int64_t context_;
};

}  // namespace

int run_synthetic_bench(backend::Context& ctx, const std::string& name, const std::string& weights,
                        const std::vector<int64_t>& requested, int64_t context, bool json) {
  R3_CHECK(ctx.device() == Device::kCuda, "--synthetic makes its weights on the GPU: add --device cuda");
  models::SyntheticShape shape = models::SyntheticShape::named(name);
  shape.fp8 = weights == "fp8";
  const SyntheticBench bench(ctx, shape, context);
  const auto built = Clock::now();
  auto model = models::synthetic_on_device(ctx, shape);
  spdlog::info("bench: synthetic {} ({:.1f} GB of random {} weights) made on the GPU in {:.2f} s", name,
               static_cast<double>(shape.weight_bytes()) / 1e9, weights, seconds_since(built));
  const double bandwidth = backend::measure_copy_bandwidth(ctx);
  const int64_t free_bytes = backend::device_memory_free(ctx);
  const models::BatchesThatFit fit = models::batches_that_fit(shape, requested, context, free_bytes);
  nlohmann::json skipped = nlohmann::json::array();
  for (const int64_t batch : fit.skipped) {
    const double needed = static_cast<double>(shape.kv_cache_bytes(batch, context + models::kSyntheticSparePositions) +
                                              models::kSyntheticStepMargin);
    spdlog::warn("bench: batch {} skipped: its KV cache and step need {:.1f} GB, {:.1f} GB of device memory is free",
                 batch, needed / 1e9, static_cast<double>(free_bytes) / 1e9);
    skipped.push_back({{"batch", batch}, {"needed_GB", needed / 1e9}, {"free_GB", static_cast<double>(free_bytes) / 1e9}});
  }
  const std::vector<int64_t>& batches = fit.run;
  nlohmann::json decode = nlohmann::json::array();
  for (const int64_t batch : batches) {
    double distinct = 0;
    SyntheticBench::LogitsPath logits{};
    const double ms = bench.decode_ms(*model, batch, &distinct, &logits);
    const double bytes = bench.step_bytes(batch, distinct);
    const double floor_ms = bytes / bandwidth * 1e3;
    decode.push_back({{"batch", batch}, {"context", context}, {"ms", ms}, {"GB", bytes / 1e9},
                      {"distinct_experts_per_layer", distinct / static_cast<double>(shape.layers)},
                      {"achieved_TB_per_s", bytes / (ms * 1e-3) / 1e12}, {"floor_ms", floor_ms},
                      {"of_floor", floor_ms / ms}, {"logits_step_ms", logits.step_ms},
                      {"logits_copy_ms", logits.copy_ms}, {"host_draw_ms", logits.host_draw_ms}});
    spdlog::info("bench: decode at batch {}: {:.3f} ms", batch, ms);
  }
  // The same steps with the batch-invariant kernels (attention's chunk length fixed; the bf16
  // projections already are).
  ctx.set_batch_invariant(true);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const double invariant_ms = bench.decode_ms(*model, batches[i], nullptr);
    decode[i]["batch_invariant_ms"] = invariant_ms;
    decode[i]["batch_invariant_cost"] = invariant_ms / decode[i]["ms"].get<double>() - 1.0;
  }
  ctx.set_batch_invariant(false);
  // The other MoE paths where their kernels differ from the default (mega)'s: steps of up to
  // kPairMajorTokens sequences (above, monolithic runs mega's kernels and modular differs only in
  // launching the combine apart when the experts do not take the tensor cores).
  for (const auto& [path, key] : {std::pair{moe::MoePath::kModular, "modular_ms"},
                                  std::pair{moe::MoePath::kMonolithic, "monolithic_ms"}}) {
    models::set_moe_path(*model, path);
    for (std::size_t i = 0; i < batches.size(); ++i) {
      if (batches[i] <= moe::kPairMajorTokens) decode[i][key] = bench.decode_ms(*model, batches[i], nullptr);
    }
  }
  models::set_moe_path(*model, moe::MoePath::kMega);
  const double prefill_s = bench.prefill_seconds(*model);
  // The same steps with capture off, interleaved with steps with it on.
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const auto cost = bench.capture_cost(*model, batches[i]);
    decode[i]["capture_on_ms"] = cost.on_ms;
    decode[i]["capture_off_ms"] = cost.off_ms;
    decode[i]["capture_overhead"] = cost.overhead;
  }
  const nlohmann::json out = {{"synthetic", name},
                              {"weights", weights},
                              {"copy_TB_per_s", bandwidth / 1e12},
                              {"decode", decode},
                              {"skipped", skipped},
                              {"prefill", {{"tokens", kPrefillTokens},
                                           {"seconds", prefill_s},
                                           {"tokens_per_s", static_cast<double>(kPrefillTokens) / prefill_s}}}};
  if (json) {
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("synthetic {} ({} weights): copy bandwidth {:.3f} TB/s; decode with a {}-token context per sequence\n",
             name, weights, bandwidth / 1e12, context);
  fmt::print("{:>6} {:>10} {:>9} {:>8} {:>9} {:>8} {:>12} {:>9} {:>16} {:>12} {:>10}\n", "batch", "step ms", "GB",
             "experts", "TB/s", "floor", "capture off", "capture", "batch-invariant", "logits step", "host draw");
  for (const auto& d : decode) {
    fmt::print("{:>6} {:>10.3f} {:>9.2f} {:>8.1f} {:>9.3f} {:>7.1f}% {:>12.3f} {:>+8.2f}% {:>9.3f} {:>+5.1f}% {:>12.3f} {:>10.3f}\n",
               d["batch"].get<int64_t>(), d["ms"].get<double>(), d["GB"].get<double>(),
               d["distinct_experts_per_layer"].get<double>(), d["achieved_TB_per_s"].get<double>(),
               100 * d["of_floor"].get<double>(), d["capture_off_ms"].get<double>(),
               100 * d["capture_overhead"].get<double>(), d["batch_invariant_ms"].get<double>(),
               100 * d["batch_invariant_cost"].get<double>(), d["logits_step_ms"].get<double>(),
               d["host_draw_ms"].get<double>());
  }
  for (const auto& d : decode) {
    if (d.contains("modular_ms")) {
      fmt::print("batch {}: {:.3f} ms a step with --moe-path modular, {:.3f} ms with monolithic (mega: {:.3f} ms)\n",
                 d["batch"].get<int64_t>(), d["modular_ms"].get<double>(), d["monolithic_ms"].get<double>(),
                 d["ms"].get<double>());
    }
  }
  for (const auto& d : skipped) {
    fmt::print("batch {}: skipped, {:.1f} GB needed, {:.1f} GB free\n", d["batch"].get<int64_t>(),
               d["needed_GB"].get<double>(), d["free_GB"].get<double>());
  }
  fmt::print("prefill of {} tokens: {:.3f} s ({:.0f} tokens/s)\n", kPrefillTokens, prefill_s,
             static_cast<double>(kPrefillTokens) / prefill_s);
  return 0;
}

}  // namespace r3::cli
