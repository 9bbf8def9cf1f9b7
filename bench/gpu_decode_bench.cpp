// Whole decode steps of the engine's device model at the benchmark shape (Qwen3-30B-A3B:
// 48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts of width 768, top-8, vocab
// 151936), with random bf16 weights made on the GPU (models/device_decoder.h, synthetic_on_device),
// against the memory-bandwidth floor. Run on the GPU machine by bench/gpu.sh; one JSON line each.
//
// - copy: the device's copy bandwidth, measured here (2 x bytes / time of device-to-device copies
//   of 2 GiB), the yardstick for every ratio below.
// - decode: one step of `batch` sequences, each at position 1023 (a 1k context; the cache is set
//   to 1023 cached positions before every step, their values irrelevant to the time). Bytes a step
//   must read: attention projections, router gates, the distinct experts the step routed to
//   (counted from its captured ids, per layer), lm_head, and every sequence's K/V (float32).
//   Floor = bytes / copy bandwidth. Time: mean of 20 steps after 3 warm-up steps (the second
//   captures the step's CUDA graph), host clock around forward_into (the step ends with its
//   logits on the host).
// - decode_capture_off: the same steps on a model whose routing kernels capture nothing (the
//   same seed: the same weights and routing); capture's cost is the difference.
// - prefill: one sequence of 4096 tokens in one step.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <vector>

#include "backend/context.h"
#include "backend/cuda/state.h"
#include "models/device_decoder.h"
#include "moe/routing_capturer.h"
#include "gpu_event_timer.h"

namespace r3 {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double copy_bandwidth(backend::Context& gpu) {
  const std::size_t bytes = std::size_t{2} << 30;
  void *src = nullptr, *dst = nullptr;
  R3_CUDA_CHECK(cudaMalloc(&src, bytes));
  R3_CUDA_CHECK(cudaMalloc(&dst, bytes));
  const cudaStream_t stream = gpu.cuda_state().stream;
  const double ms = bench::mean_ms(
      gpu, [&] { R3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); }, 3, 20);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

int run() {
  auto gpu = backend::Context::cuda(0);
  const models::SyntheticShape s = models::SyntheticShape::named("qwen3-30b-a3b");
  auto start = std::chrono::steady_clock::now();
  auto model = models::synthetic_on_device(*gpu, s);
  std::printf("{\"bench\":\"synthetic_model\",\"name\":\"qwen3-30b-a3b\",\"weight_GB\":%.2f,\"build_s\":%.1f}\n",
              static_cast<double>(s.weight_bytes()) / 1e9, seconds_since(start));
  const double bandwidth = copy_bandwidth(*gpu);
  std::printf("{\"bench\":\"copy\",\"TB_per_s\":%.3f}\n", bandwidth / 1e12);
  std::fflush(stdout);

  const int64_t kv_width = s.kv_heads * s.head_dim, context = 1024;
  const auto f = [](int64_t v) { return static_cast<double>(v); };
  const double layers = f(s.layers);
  const double attention_bytes = 2.0 * (2.0 * f(s.hidden * s.heads * s.head_dim) + 2.0 * f(s.hidden * kv_width));
  const double expert_bytes = 2.0 * 3.0 * static_cast<double>(s.expert_width * s.hidden);
  const double gate_bytes = 4.0 * static_cast<double>(s.experts * s.hidden);
  const double lm_head_bytes = 2.0 * static_cast<double>(s.vocab * s.hidden);
  const std::vector<int64_t> batches = {1, 8, 64, 256};
  std::vector<double> with_capture;
  // Mean step time of `batch` sequences at position 1023; with capture, the step's mean distinct
  // experts per layer into *distinct.
  auto decode = [&](models::CausalLM& m, int64_t batch, bool capture, double* distinct) {
    auto cache = m.make_cache(batch, context + 16);
    models::ForwardBatch step;
    for (int64_t b = 0; b < batch; ++b) {
      step.token_ids.push_back(static_cast<int32_t>((b * 7919 + 11) % s.vocab));
      step.positions.push_back(static_cast<int32_t>(context - 1));
      step.seqs.push_back(static_cast<int32_t>(b));
    }
    moe::RoutingCapturer capturer(batch, s.layers, s.top_k, s.experts);
    if (capture) step.capture = &capturer;
    Tensor logits = Tensor::empty(DType::F32, {batch, s.vocab});
    auto run_step = [&] {
      for (int64_t b = 0; b < batch; ++b) cache->set_length(b, context - 1);
      if (capture) capturer.begin_step(batch);
      m.forward_into(*gpu, step, *cache, logits);
      if (capture) capturer.end_step();
    };
    for (int i = 0; i < 3; ++i) run_step();  // the second captures the step's graph
    constexpr int kSteps = 20;
    const auto begin = std::chrono::steady_clock::now();
    for (int i = 0; i < kSteps; ++i) run_step();
    const double ms = seconds_since(begin) * 1e3 / kSteps;
    if (distinct != nullptr) {
      *distinct = 0;
      for (int64_t l = 0; l < s.layers; ++l) {
        std::set<int32_t> used;
        for (int64_t t = 0; t < batch; ++t) {
          for (int64_t c = 0; c < s.top_k; ++c) used.insert(capturer.id(t, l, c));
        }
        *distinct += static_cast<double>(used.size());
      }
    }
    return ms;
  };
  for (const int64_t batch : batches) {
    double distinct = 0;
    const double ms = decode(*model, batch, true, &distinct);
    with_capture.push_back(ms);
    const double kv_bytes = 2.0 * 4.0 * f(batch * context * kv_width) * layers;
    const double bytes = layers * (attention_bytes + gate_bytes) + distinct * expert_bytes + lm_head_bytes + kv_bytes;
    const double floor_ms = bytes / bandwidth * 1e3;
    std::printf("{\"bench\":\"decode\",\"batch\":%lld,\"context\":%lld,\"ms\":%.3f,\"GB\":%.3f,\"distinct_experts_per_layer\":"
                "%.1f,\"achieved_TB_per_s\":%.3f,\"floor_ms\":%.3f,\"of_floor\":%.3f}\n",
                static_cast<long long>(batch), static_cast<long long>(context), ms, bytes / 1e9, distinct / layers,
                bytes / (ms * 1e-3) / 1e12, floor_ms, floor_ms / ms);
    std::fflush(stdout);
  }
  {
    const int64_t prompt = 4096;
    auto cache = model->make_cache(1, prompt);
    models::ForwardBatch step;
    for (int64_t t = 0; t < prompt; ++t) {
      step.token_ids.push_back(static_cast<int32_t>((t * 7919 + 11) % s.vocab));
      step.positions.push_back(static_cast<int32_t>(t));
      step.seqs.push_back(0);
    }
    step.logit_rows = {prompt - 1};
    moe::RoutingCapturer capturer(prompt, s.layers, s.top_k, s.experts);
    step.capture = &capturer;
    Tensor logits = Tensor::empty(DType::F32, {1, s.vocab});
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      cache->clear(0);
      capturer.begin_step(prompt);
      start = std::chrono::steady_clock::now();
      model->forward_into(*gpu, step, *cache, logits);
      best = std::min(best, seconds_since(start));
      capturer.end_step();
    }
    std::printf("{\"bench\":\"prefill\",\"tokens\":%lld,\"best_of_3_s\":%.3f,\"tokens_per_s\":%.0f}\n",
                static_cast<long long>(prompt), best, static_cast<double>(prompt) / best);
  }
  // The same steps with capture off: the routing kernels write no rows, nothing is copied back.
  model.reset();
  auto uncaptured = models::synthetic_on_device(*gpu, s, 1, /*capture_routing=*/false);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const double ms = decode(*uncaptured, batches[i], false, nullptr);
    std::printf("{\"bench\":\"decode_capture_off\",\"batch\":%lld,\"ms\":%.3f,\"capture_on_ms\":%.3f,"
                "\"capture_overhead\":%.4f}\n",
                static_cast<long long>(batches[i]), ms, with_capture[i], with_capture[i] / ms - 1.0);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace r3

int main() {
  try {
    return r3::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_decode_bench: %s\n", e.what());
    return 1;
  }
}
