// CPU benchmarks with the bytes and FLOPs each step must move, so time can be read against the
// machine's limits. Decode at batch 1 is memory-bound: its yardstick is bytes / copy bandwidth.
//
//   make bench            (or build/r3_bench --benchmark_filter=Decode)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "moe/routing_capturer.h"
#include "ops/linear.h"

namespace r3 {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Copy bandwidth of this machine (read + write bytes per second): the decode yardstick.
void BM_MemcpyBandwidth(benchmark::State& state) {
  const std::size_t bytes = std::size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(2 * bytes) * state.iterations());
}
BENCHMARK(BM_MemcpyBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime();

// y[M, N] = x[M, K] w[N, K]^T: 2*M*N*K FLOPs, 4*(N*K + M*K + M*N) bytes.
void BM_Linear(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  std::mt19937 rng(1);
  Tensor x = random_tensor({m, k}, rng, 1), w = random_tensor({n, k}, rng, 1);
  Tensor y = Tensor::empty(DType::F32, {m, n});
  backend::Context ctx(0);
  for (auto _ : state) ops::linear(ctx, x, w, nullptr, y);
  state.counters["FLOP/s"] = benchmark::Counter(static_cast<double>(2 * m * n * k) * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
  state.SetBytesProcessed(4 * (n * k + m * k + m * n) * state.iterations());
}
BENCHMARK(BM_Linear)->Args({1, 2048, 2048})->Args({16, 2048, 2048})->Args({128, 2048, 768})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same with bf16 weights (widened in the kernel), at the shapes of the serving benchmark
// model: its LM head (1024 -> 32000) and a 1024 x 1024 attention projection, at batch 1, 4 and 16.
// 2*M*N*K FLOPs; 2*N*K weight bytes dominate.
void BM_LinearBf16(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  std::mt19937 rng(1);
  Tensor x = random_tensor({m, k}, rng, 1), wf = random_tensor({n, k}, rng, 1);
  Tensor w = Tensor::empty(DType::BF16, {n, k});
  auto* bits = static_cast<uint16_t*>(w.raw_data());
  for (int64_t i = 0; i < w.numel(); ++i) bits[i] = f32_to_bf16(wf.data<float>()[i]);
  Tensor y = Tensor::empty(DType::F32, {m, n});
  backend::Context ctx(0);
  for (auto _ : state) ops::linear(ctx, x, w, nullptr, y);
  state.counters["FLOP/s"] = benchmark::Counter(static_cast<double>(2 * m * n * k) * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
  state.SetBytesProcessed(2 * n * k * state.iterations());
}
BENCHMARK(BM_LinearBf16)->ArgsProduct({{1, 4, 16}, {1024}, {1024, 32000}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same with FP8 (e4m3) weights in 128 x 128 blocks, as published FP8 checkpoints store them
// (decoded and scaled in the kernel): half the weight bytes of bf16. N*K weight bytes dominate.
void BM_LinearFp8(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2), block = 128;
  std::mt19937 rng(1);
  Tensor x = random_tensor({m, k}, rng, 1), wf = random_tensor({n, k}, rng, 1);
  Tensor w = Tensor::empty(DType::F8_E4M3, {n, k});
  BlockScales scales;
  scales.scales = Tensor::empty(DType::F32, {(n + block - 1) / block, (k + block - 1) / block});
  scales.block_rows = scales.block_cols = block;
  for (int64_t i = 0; i < scales.scales.numel(); ++i) scales.scales.data<float>()[i] = 4.0f / 448.0f;
  auto* bytes = static_cast<uint8_t*>(w.raw_data());
  for (int64_t i = 0; i < w.numel(); ++i) bytes[i] = f32_to_f8_e4m3(std::clamp(wf.data<float>()[i] * 112.0f, -448.0f, 448.0f));
  w = w.with_block_scales(std::move(scales));
  Tensor y = Tensor::empty(DType::F32, {m, n});
  backend::Context ctx(0);
  for (auto _ : state) ops::linear(ctx, x, w, nullptr, y);
  state.counters["FLOP/s"] = benchmark::Counter(static_cast<double>(2 * m * n * k) * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
  state.SetBytesProcessed(n * k * state.iterations());
}
BENCHMARK(BM_LinearFp8)->ArgsProduct({{1, 4, 16}, {1024}, {1024, 32000}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// One step with its routed-experts capture buffer, as the engine runs it (capture included in the time).
Tensor forward_captured(models::CausalLM& model, backend::Context& ctx, models::ForwardBatch batch, models::ModelCache& cache) {
  const models::ModelInfo& info = model.info();
  moe::RoutingCapturer capturer(batch.size(), static_cast<int64_t>(info.moe_layers.size()), info.top_k, info.num_experts);
  capturer.begin_step(batch.size());
  batch.capture = &capturer;
  return model.forward(ctx, batch, cache);
}

// A synthetic Qwen3-MoE-shaped checkpoint (random weights) written once to a temp folder.
struct SyntheticModel {
  static constexpr int64_t kHidden = 512, kLayers = 8, kHeads = 8, kKvHeads = 2, kHeadDim = 64;
  static constexpr int64_t kExperts = 32, kTopK = 4, kExpertWidth = 256, kVocab = 8192;
  std::filesystem::path dir;

  SyntheticModel() {
    dir = std::filesystem::temp_directory_path() / "r3-bench-qwen3-moe";
    std::filesystem::create_directories(dir);
    nlohmann::json config = {
        {"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
        {"hidden_size", kHidden}, {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads},
        {"num_key_value_heads", kKvHeads}, {"head_dim", kHeadDim}, {"vocab_size", kVocab},
        {"intermediate_size", 4 * kHidden}, {"moe_intermediate_size", kExpertWidth},
        {"num_experts", kExperts}, {"num_experts_per_tok", kTopK}, {"norm_topk_prob", true},
        {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}};
    std::ofstream(dir / "config.json") << config.dump(1);
    std::mt19937 rng(7);
    std::vector<NamedTensor> t;
    auto add = [&](const std::string& name, Shape shape) {
      const float scale = shape.size() == 1 ? 0.0f : 1.0f / std::sqrt(static_cast<float>(shape.back()));
      Tensor w = random_tensor(shape, rng, scale);
      if (shape.size() == 1) std::fill(w.data<float>(), w.data<float>() + w.numel(), 1.0f);
      t.push_back({name, w});
    };
    add("model.embed_tokens.weight", {kVocab, kHidden});
    add("lm_head.weight", {kVocab, kHidden});
    add("model.norm.weight", {kHidden});
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {kHidden});
      add(p + "post_attention_layernorm.weight", {kHidden});
      add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
      add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
      add(p + "self_attn.q_norm.weight", {kHeadDim});
      add(p + "self_attn.k_norm.weight", {kHeadDim});
      add(p + "mlp.gate.weight", {kExperts, kHidden});
      for (int64_t e = 0; e < kExperts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        add(q + "gate_proj.weight", {kExpertWidth, kHidden});
        add(q + "up_proj.weight", {kExpertWidth, kHidden});
        add(q + "down_proj.weight", {kHidden, kExpertWidth});
      }
    }
    write_safetensors((dir / "model.safetensors").string(), t);
  }
  ~SyntheticModel() { std::filesystem::remove_all(dir); }

  // Bytes one batch-1 decode step must read at context length `ctx`: attention and router
  // weights of every layer, the top-k experts of every layer, lm_head, and the KV cache.
  static double decode_bytes(int64_t ctx) {
    const double attn = (2.0 * kHeads * kHeadDim * kHidden + 2.0 * kKvHeads * kHeadDim * kHidden);
    const double experts = static_cast<double>(kTopK) * 3 * kExpertWidth * kHidden;
    const double router = static_cast<double>(kExperts) * kHidden;
    const double kv = 2.0 * kKvHeads * kHeadDim * static_cast<double>(ctx);
    return 4.0 * (kLayers * (attn + experts + router + kv) + static_cast<double>(kVocab) * kHidden);
  }
};

const moe::MoePath kBackends[] = {moe::MoePath::kModular, moe::MoePath::kMonolithic,
                                     moe::MoePath::kMega};

SyntheticModel& synthetic_model() {
  static SyntheticModel synthetic;
  return synthetic;
}

std::unique_ptr<models::CausalLM> load_synthetic(int64_t backend) {
  models::LoadOptions options;
  options.moe_path = kBackends[backend];
  return models::load_model(synthetic_model().dir.string(), options);
}

// Args: context length, MoE backend (0 modular, 1 monolithic, 2 mega).
void BM_DecodeStep(benchmark::State& state) {
  const int64_t context = state.range(0);
  auto model = load_synthetic(state.range(1));
  state.SetLabel(std::string(moe::moe_path_name(kBackends[state.range(1)])));
  backend::Context ctx(0);
  auto cache_owner = model->make_cache(1, context + 1);
  models::ModelCache& cache = *cache_owner;
  std::vector<int32_t> prompt(static_cast<std::size_t>(context));
  for (int64_t i = 0; i < context; ++i) prompt[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 37) % 8192);
  forward_captured(*model, ctx, models::ForwardBatch::sequence(prompt, 0), cache);
  for (auto _ : state) {
    cache.set_length(0, context);  // decode the same position again each iteration
    Tensor logits = forward_captured(*model, ctx, models::ForwardBatch::sequence({11}, static_cast<int32_t>(context)), cache);
    benchmark::DoNotOptimize(logits.raw_data());
  }
  const double bytes = SyntheticModel::decode_bytes(context);
  state.counters["bytes/step"] = bytes;
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}
BENCHMARK(BM_DecodeStep)
    ->ArgsProduct({{64, 1024}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A prefill of `tokens` tokens: weights once, 2 * params FLOPs per token for the active path.
void BM_Prefill(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  auto model = load_synthetic(state.range(1));
  state.SetLabel(std::string(moe::moe_path_name(kBackends[state.range(1)])));
  backend::Context ctx(0);
  std::vector<int32_t> ids(static_cast<std::size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 37) % 8192);
  for (auto _ : state) {
    auto cache_owner = model->make_cache(1, tokens);
    models::ModelCache& cache = *cache_owner;
    models::ForwardBatch batch = models::ForwardBatch::sequence(ids, 0);
    batch.logit_rows = {tokens - 1};
    Tensor logits = forward_captured(*model, ctx, batch, cache);
    benchmark::DoNotOptimize(logits.raw_data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens) * static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Prefill)->ArgsProduct({{256}, {0, 1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace r3

BENCHMARK_MAIN();
