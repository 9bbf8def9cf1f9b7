// What batching and prefix caching buy on a real checkpoint folder, through the serving engine:
//
//   build/r3_serving_bench --model DIR [--threads 2] [--batch 16] [--prompt 32] [--gen 64]
//                          [--prefix 1024] [--reps 3]
//
// Per repetition (after one untimed warm-up that touches every weight page), one JSON line:
// - batched: `batch` requests submitted together, aggregate decode tokens/s over the steps after
//   every request has its first token; with the bytes such a step moves (the non-expert weights
//   once, plus each distinct (layer, expert) the batch's tokens routed to, measured from the
//   captured routing) and the ratio to the single request's rate.
// - single: one request at a time (a new one when it finishes), decode tokens/s over its steps
//   after its first token, measured in quarter-second slices taking turns with the batch, so both
//   rates come from the same seconds of a machine whose bandwidth drifts.
// - prefix: time to first token of a request with a `prefix`-token prompt head, then of a second
//   request sharing that head (its blocks come from the prefix cache), and their ratio.
// Prompts are the peer benchmark's LCG token sequence (../shared/peer-llamacpp), offset per request.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "backend/context.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "models/registry.h"

namespace r3 {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::vector<int32_t> lcg_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> prompt;
  uint64_t s = 12345 + seed;
  for (int64_t i = 0; i < len; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    prompt.push_back(static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab - 1)));
  }
  return prompt;
}

engine::RequestParams request(std::vector<int32_t> prompt, int64_t gen) {
  engine::RequestParams p;
  p.prompt = std::move(prompt);
  p.max_new_tokens = gen;
  p.ignore_eos = true;
  p.return_routed_experts = true;
  return p;
}

// One engine and its requests, stepped from outside so that two of them can take turns. A
// step's time counts as decode time when every request then running had its first token before
// it began (prefill steps are not timed).
class TimedEngine {
 public:
  TimedEngine(models::CausalLM& model, backend::Context& ctx, int64_t max_running, engine::EngineOptions options)
      : engine_(model, ctx, [&] {
          options.scheduler.max_running = max_running;
          return options;
        }()) {}

  void submit(std::vector<int32_t> prompt, int64_t gen) {
    const engine::RequestId id = engine_.submit(request(std::move(prompt), gen));
    if (first_id_ < 0) first_id_ = id;
    produced_.push_back(0);
    routed_.emplace_back();
  }

  bool has_work() const { return engine_.has_work(); }

  void step() {
    const bool decoding = without_token_ == 0;
    const auto start = Clock::now();
    const auto outputs = engine_.step();
    const double took = seconds(start, Clock::now());
    for (const auto& out : outputs) {
      const auto r = static_cast<std::size_t>(out.id - first_id_);
      for (const auto& s : out.samples) {
        const auto n = static_cast<int64_t>(s.token_ids.size());
        if (decoding) decode_tokens_ += n;
        produced_[r] += n;
        if (s.finish != engine::FinishReason::kNone) routed_[r] = s.routed_experts;
      }
    }
    without_token_ = 0;
    for (std::size_t r = 0; r < produced_.size(); ++r) without_token_ += produced_[r] == 0 ? 1 : 0;
    if (decoding) decode_s_ += took;
  }

  double decode_tok_s() const { return static_cast<double>(decode_tokens_) / decode_s_; }
  const std::vector<std::vector<int32_t>>& routed() const { return routed_; }  // per request

 private:
  engine::Engine engine_;
  engine::RequestId first_id_ = -1;
  std::vector<int64_t> produced_;
  std::vector<std::vector<int32_t>> routed_;
  int64_t without_token_ = 1, decode_tokens_ = 0;
  double decode_s_ = 0;
};

// Runs `engine` until `slice_s` seconds have passed or it has no work.
void run_slice(TimedEngine& engine, double slice_s) {
  const auto start = Clock::now();
  while (engine.has_work() && seconds(start, Clock::now()) < slice_s) engine.step();
}

int run(const std::string& dir, int threads, int64_t batch, int64_t prompt_len, int64_t gen, int64_t prefix, int reps) {
  auto model = models::load_model(dir, {});
  const models::ModelInfo& info = model->info();
  backend::Context ctx(threads);
  // Bytes: every non-expert tensor but the embedding table, one embedding row per token, and each
  // distinct expert a step touches.
  const Checkpoint ckpt = Checkpoint::open(dir);
  double dense = 0, experts = 0;
  for (const std::string& name : ckpt.tensor_names()) {
    const double b = static_cast<double>(ckpt.stored_bytes(name));
    if (name.find(".experts.") != std::string::npos) experts += b;
    else if (name != "model.embed_tokens.weight") dense += b;
  }
  const double expert_bytes = experts / static_cast<double>(info.moe_layers.size() * static_cast<std::size_t>(info.num_experts));
  const auto per_row = static_cast<int64_t>(info.moe_layers.size()) * info.top_k;
  engine::EngineOptions options;
  options.max_model_len = std::max(prompt_len + gen, prefix + 16 + 2);

  std::vector<std::vector<int32_t>> prompts;
  for (int64_t r = 0; r < batch; ++r) prompts.push_back(lcg_prompt(prompt_len, info.vocab_size, static_cast<uint64_t>(r)));
  for (int rep = -1; rep < reps; ++rep) {
    // The single request and the batch take turns in slices of a quarter second (a new single
    // request starts whenever one finishes) until the batch is done, so that both rates are
    // measured over the same seconds: this machine's memory bandwidth, shared with other
    // tenants, drifts within minutes, so runs one after the other would compare different
    // machines (docs/performance.md). Slices, not alternate
    // steps, so that neither engine's step starts on caches the other just filled.
    constexpr double kSlice = 0.25;
    TimedEngine single(*model, ctx, 1, options), together(*model, ctx, batch, options);
    for (const auto& p : prompts) together.submit(p, gen);
    for (uint64_t next_single = 0; together.has_work();) {
      run_slice(together, kSlice);
      const auto start = Clock::now();
      while (seconds(start, Clock::now()) < kSlice) {
        if (!single.has_work()) single.submit(lcg_prompt(prompt_len, info.vocab_size, 5000 + next_single++), gen);
        run_slice(single, kSlice - seconds(start, Clock::now()));
      }
    }
    if (rep < 0) continue;
    // Distinct experts of a decode step: the rows the batch computed at the same output index.
    double distinct_sum = 0;
    for (int64_t i = 1; i < gen; ++i) {
      std::set<std::pair<int64_t, int32_t>> touched;
      for (const auto& routed : together.routed()) {
        const int64_t row = prompt_len + i - 1;
        for (int64_t c = 0; c < per_row; ++c) touched.insert({c / info.top_k, routed[static_cast<std::size_t>(row * per_row + c)]});
      }
      distinct_sum += static_cast<double>(touched.size());
    }
    const double distinct = distinct_sum / static_cast<double>(gen - 1);
    const double single_bytes = dense + static_cast<double>(per_row) * expert_bytes;
    const double batch_bytes = dense + distinct * expert_bytes;

    // Prefix: the first request fills the cache, the second shares its head.
    engine::Engine e(*model, ctx, [&] {
      engine::EngineOptions o = options;
      o.scheduler.max_running = 1;
      o.scheduler.max_step_tokens = prefix + 16;
      return o;
    }());
    std::vector<int32_t> head = lcg_prompt(prefix, info.vocab_size, 1000);
    double ttft[2] = {0, 0};
    for (int which = 0; which < 2; ++which) {
      std::vector<int32_t> p = head;
      for (int32_t t : lcg_prompt(16, info.vocab_size, 2000 + static_cast<uint64_t>(which))) p.push_back(t);
      const auto start = Clock::now();
      e.submit(request(p, 1));
      while (e.has_work()) e.step();
      ttft[which] = seconds(start, Clock::now());
    }
    fmt::print(
        "{{\"rep\":{},\"threads\":{},\"batch\":{},\"prompt\":{},\"gen\":{},\"single_decode_tok_s\":{:.2f},"
        "\"batched_decode_tok_s\":{:.2f},\"batched_over_single\":{:.3f},\"single_MB_per_step\":{:.1f},"
        "\"batched_distinct_experts_per_step\":{:.1f},\"batched_MB_per_step\":{:.1f},"
        "\"bandwidth_bound_ratio\":{:.3f},\"prefix\":{},\"ttft_first_ms\":{:.2f},\"ttft_shared_ms\":{:.2f},"
        "\"ttft_ratio\":{:.4f},\"prefix_blocks_hit\":{}}}\n",
        rep, ctx.threads().size(), batch, prompt_len, gen, single.decode_tok_s(), together.decode_tok_s(),
        together.decode_tok_s() / single.decode_tok_s(), single_bytes / 1e6, distinct, batch_bytes / 1e6,
        static_cast<double>(batch) * single_bytes / batch_bytes, prefix, 1e3 * ttft[0], 1e3 * ttft[1], ttft[1] / ttft[0],
        e.stats().prefix_blocks_hit);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace r3

int main(int argc, char** argv) {
  CLI::App app{"r3 serving benchmark: batched decode and prefix-cache time to first token"};
  std::string dir;
  int threads = 2, reps = 3;
  int64_t batch = 16, prompt = 32, gen = 64, prefix = 1024;
  app.add_option("--model", dir, "Hugging Face model folder")->required();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--batch", batch, "Concurrent requests")->capture_default_str();
  app.add_option("--prompt", prompt, "Prompt tokens per request")->capture_default_str();
  app.add_option("--gen", gen, "Tokens generated per request")->capture_default_str();
  app.add_option("--prefix", prefix, "Shared prompt head of the time-to-first-token pair")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return r3::run(dir, threads, batch, prompt, gen, prefix, reps);
  } catch (const std::exception& e) {
    fmt::print(stderr, "r3_serving_bench: error: {}\n", e.what());
    return 1;
  }
}
