// Decode and prefill speed of r3 on a real checkpoint folder, as bytes moved per second against a
// read-bandwidth probe taken in the same process right before each repetition.
//
//   build/r3_model_bench --model DIR [--threads 2] [--prompt 32] [--gen 64] [--reps 3]
//
// One JSON line per timed repetition (after one untimed warm-up that touches every page), with
// tg_tok_s so the peer comparison script (ENGINE_CMD of ../shared/peer-llamacpp/run_bench.sh)
// records it next to llama.cpp. The prompt is the peer's LCG token sequence, so both engines see
// the same ids.
//
// Bytes of a decode step (batch 1): every tensor of the checkpoint except the routed experts and
// the embedding table, plus top_k experts of each MoE layer, one embedding row and the KV cache
// read at the step's context. Bytes of a prefill: the same non-expert weights, the experts the
// prompt actually routed to (distinct (layer, expert) pairs from the captured routing), the
// embedding rows, and the KV cache written.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/context.h"
#include "engine/generator.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "ops/matmul.h"

namespace r3 {
namespace {

// Sums a 1 GiB buffer (16 float lanes per thread, as STREAM's read kernel): bytes read per second,
// best of `rounds`.
double read_bandwidth(backend::Context& ctx, int rounds = 3) {
  const std::size_t count = (std::size_t{1} << 30) / sizeof(float);
  static std::vector<float> buffer(count, 1.0f);
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<float> partial(static_cast<std::size_t>(ctx.threads().size()) * 64, 0.0f);
    const auto start = std::chrono::steady_clock::now();
    ctx.parallel_for(ctx.threads().size(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t part = begin; part < end; ++part) {
        const std::size_t first = count / static_cast<std::size_t>(ctx.threads().size()) * static_cast<std::size_t>(part);
        const std::size_t last = first + count / static_cast<std::size_t>(ctx.threads().size());
        float acc[16] = {};
        for (std::size_t i = first; i < last; i += 16) {
          for (int l = 0; l < 16; ++l) acc[l] += buffer[i + static_cast<std::size_t>(l)];
        }
        for (int l = 0; l < 16; ++l) partial[static_cast<std::size_t>(part) * 64] += acc[l];
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (partial[0] < 0) fmt::print(stderr, "impossible\n");  // keeps the sum alive
    best = std::max(best, static_cast<double>(count * sizeof(float)) / s);
  }
  return best;
}

struct ByteModel {
  double dense = 0;            // non-expert tensors, embedding table excluded
  double embed_row = 0;        // one embedding row
  double expert = 0;           // one expert (gate + up + down) of one layer
  double kv_per_position = 0;  // K and V of one position, all layers (float32 cache)
};

ByteModel byte_model(const std::string& dir, const models::ModelInfo& info) {
  const Checkpoint ckpt = Checkpoint::open(dir);
  const HfConfig config = HfConfig::load(dir);
  ByteModel b;
  double experts = 0;
  for (const std::string& name : ckpt.tensor_names()) {
    const double bytes = static_cast<double>(ckpt.stored_bytes(name));
    if (name.find(".experts.") != std::string::npos) {
      experts += bytes;
    } else if (name == "model.embed_tokens.weight") {
      b.embed_row = bytes / static_cast<double>(info.vocab_size);
    } else {
      b.dense += bytes;
    }
  }
  b.expert = experts / static_cast<double>(info.moe_layers.size() * static_cast<std::size_t>(info.num_experts));
  const int64_t head_dim = config.get_int("head_dim", config.get_int("hidden_size") / config.get_int("num_attention_heads"));
  b.kv_per_position = 2.0 * 4.0 * static_cast<double>(info.num_layers * config.get_int("num_key_value_heads") * head_dim);
  return b;
}

int run(const std::string& dir, int threads, int prompt_len, int gen, int reps) {
  models::LoadOptions options;
  auto model = models::load_model(dir, options);
  const models::ModelInfo& info = model->info();
  backend::Context ctx(threads);
  const ByteModel bytes = byte_model(dir, info);

  std::vector<int32_t> prompt;
  uint64_t s = 12345;  // the peer benchmark's prompt: an LCG over the vocabulary minus its last id
  for (int i = 0; i < prompt_len; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    prompt.push_back(static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(info.vocab_size - 1)));
  }
  engine::GenerateOptions generate;
  generate.max_new_tokens = gen + 1;  // the first new token comes from the prefill
  const auto moe_layers = static_cast<double>(info.moe_layers.size());
  const double decode_bytes = bytes.dense + bytes.embed_row + moe_layers * static_cast<double>(info.top_k) * bytes.expert +
                              bytes.kv_per_position * (prompt_len + gen / 2.0);
  for (int rep = -1; rep < reps; ++rep) {
    const double probe = read_bandwidth(ctx);
    const engine::GenerateResult result = engine::generate(*model, ctx, prompt, generate);
    if (rep < 0) continue;  // warm-up: every weight page touched once
    std::set<std::pair<int64_t, int32_t>> touched;
    for (int64_t row = 0; row < prompt_len; ++row) {
      for (int64_t l = 0; l < result.routed_experts.num_moe_layers(); ++l) {
        for (int64_t k = 0; k < info.top_k; ++k) touched.insert({l, result.routed_experts.at(row, l, k)});
      }
    }
    const double prefill_bytes = bytes.dense + static_cast<double>(touched.size()) * bytes.expert +
                                 prompt_len * (bytes.embed_row + bytes.kv_per_position);
    const auto& t = result.timings;
    const double tg = static_cast<double>(t.decode_steps) / t.decode_seconds;
    const double pp = static_cast<double>(t.prefill_tokens) / t.prefill_seconds;
    fmt::print(
        "{{\"rep\":{},\"threads\":{},\"prompt\":{},\"gen\":{},\"pp_tok_s\":{:.3f},\"tg_tok_s\":{:.3f},"
        "\"tg_ms_per_tok\":{:.3f},\"decode_MB_per_step\":{:.1f},\"decode_GBps\":{:.2f},\"prefill_MB\":{:.1f},"
        "\"prefill_GBps\":{:.2f},\"probe_read_GBps\":{:.2f},\"decode_pct_of_probe\":{:.1f},"
        "\"prefill_pct_of_probe\":{:.1f},\"matmul_kernel\":\"{}\"}}\n",
        rep, ctx.threads().size(), prompt_len, t.decode_steps, pp, tg, 1e3 / tg, decode_bytes / 1e6, decode_bytes * tg / 1e9,
        prefill_bytes / 1e6, prefill_bytes / t.prefill_seconds / 1e9, probe / 1e9, 100 * decode_bytes * tg / probe,
        100 * prefill_bytes / t.prefill_seconds / probe, ops::matmul_kernel_name());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace r3

int main(int argc, char** argv) {
  CLI::App app{"r3 decode/prefill benchmark on a checkpoint folder (bytes/s vs a read-bandwidth probe)"};
  std::string dir;
  int threads = 2, prompt = 32, gen = 64, reps = 3;
  app.add_option("--model", dir, "Hugging Face model folder")->required();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--prompt", prompt, "Prompt tokens (prefill)")->capture_default_str();
  app.add_option("--gen", gen, "Decode steps timed")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return r3::run(dir, threads, prompt, gen, reps);
  } catch (const std::exception& e) {
    fmt::print(stderr, "r3_model_bench: error: {}\n", e.what());
    return 1;
  }
}
