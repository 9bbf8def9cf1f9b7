#include "in_graph_ops.h"

#include <cstdio>
#include <vector>

#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "bench_tensors.h"
#include "gpu_event_timer.h"
#include "moe/device_capture.h"
#include "moe/device_routing.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rotary.h"

namespace r3::bench {

void small_ops_in_graph(backend::Context& gpu) {
  const int64_t h = 2048, heads = 32, kv_heads = 4, d = 128, context = 1024, block = 16, width = kv_heads * d;
  auto report = [](const char* op, double ms) {
    std::printf("{\"bench\":\"in_graph\",\"op\":\"%s\",\"tokens\":1,\"us\":%.2f}\n", op, ms * 1e3);
  };
  {
    const Tensor branch = backend::to_device(gpu, random_host(DType::F32, {1, h}, 12, 1.0f));
    const Tensor weight = backend::to_device(gpu, random_host(DType::F32, {h}, 13, 1.0f));
    Tensor residual = backend::to_device(gpu, random_host(DType::F32, {1, h}, 14, 1.0f));
    Tensor y = backend::device_empty(gpu, DType::F32, {1, h});
    report("add_rms_norm", graph_mean_ms(gpu, [&] { ops::cuda::add_rms_norm(gpu, branch, residual, &weight, 1e-6f, y); }));
  }
  // One sequence of `context` positions in a bf16 pool, the step's token at the last.
  const int64_t blocks = context / block;
  Tensor keys = backend::to_device(gpu, random_host(DType::BF16, {blocks * block, width}, 6, 1.0f));
  Tensor values = backend::to_device(gpu, random_host(DType::BF16, {blocks * block, width}, 7, 1.0f));
  std::vector<int32_t> table(static_cast<std::size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  const Tensor table_d = backend::to_device(gpu, Tensor::from(table, {blocks}));
  const Tensor seq_d = backend::to_device(gpu, Tensor::from(std::vector<int32_t>{0}, {1}));
  const Tensor position_d = backend::to_device(gpu, Tensor::from(std::vector<int32_t>{static_cast<int32_t>(context - 1)}, {1}));
  const ops::StepView step{1, nullptr, position_d.data<int32_t>(), seq_d.data<int32_t>(), table_d.data<int32_t>(), blocks,
                             context};
  const ops::KvPool pool{keys.raw_data(), values.raw_data(), width, width, block, blocks, true};
  Tensor q = backend::device_empty(gpu, DType::F32, {1, heads, d});
  {
    const int64_t qkv_width = heads * d + 2 * width;
    const Tensor qkv = backend::to_device(gpu, random_host(DType::F32, {1, qkv_width}, 15, 1.0f));
    const Tensor q_norm = backend::to_device(gpu, random_host(DType::F32, {d}, 16, 1.0f));
    const Tensor k_norm = backend::to_device(gpu, random_host(DType::F32, {d}, 17, 1.0f));
    const float* p = qkv.data<float>();
    const ops::AttentionRows rows{p, qkv_width, p + heads * d, qkv_width, p + heads * d + width, qkv_width,
                                        q_norm.data<float>(), k_norm.data<float>()};
    const ops::Rotary rotary(d, 1e6);
    report("prepare", graph_mean_ms(gpu, [&] {
             ops::cuda::prepare_attention_rows(gpu, rotary, rows, heads, kv_heads, d, 1e-6f, step, pool, q);
           }));
  }
  {
    Tensor out = backend::device_empty(gpu, DType::F32, {1, heads, d});
    report("attention", graph_mean_ms(gpu, [&] { ops::cuda::paged_attention(gpu, q, step, pool, kv_heads, 0.088f, 0, nullptr, out); }));
  }
  const int64_t experts = 128, k = 8;
  Tensor logits = backend::device_empty(gpu, DType::F32, {1, experts});
  {
    const Tensor x = backend::to_device(gpu, random_host(DType::F32, {1, h}, 18, 1.0f));
    const Tensor router = backend::to_device(gpu, random_host(DType::F32, {experts, h}, 19, 0.02f));
    report("router", graph_mean_ms(gpu, [&] { ops::linear(gpu, x, router, nullptr, logits); }));
  }
  {
    moe::DeviceCaptureBuffer capture(gpu, 1, 1, k);
    const moe::DeviceRoutingRule rule{moe::DeviceRoutingRule::Kind::kSoftmaxTopK, static_cast<int32_t>(k), true};
    Tensor ids = backend::device_empty(gpu, DType::I32, {1, k}), weights = backend::device_empty(gpu, DType::F32, {1, k});
    auto route = [&] {
      moe::route_on_device(gpu, logits, rule, nullptr, nullptr, ids.data<int32_t>(), weights.data<float>(),
                           capture.layer_rows(0));
    };
    report("routing", graph_mean_ms(gpu, route));
  }
}

}  // namespace r3::bench
