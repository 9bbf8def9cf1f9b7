#include "projections_in_graph.h"

#include <cstdio>
#include <string>
#include <vector>

#include "backend/device_memory.h"
#include "bench_tensors.h"
#include "gpu_event_timer.h"
#include "ops/linear.h"

namespace r3::bench {

namespace {

// Weight buffers that together hold at least this many bytes: about three times a Hopper GPU's
// L2 (50 MB on an H100), so a buffer is long gone from L2 when the cycle comes back to it.
constexpr double kCycleBytes = 160e6;

Tensor device_weight(backend::Context& gpu, int64_t n, int64_t k, DType dtype, uint32_t seed) {
  if (dtype != DType::F8_E4M3) return backend::to_device(gpu, random_host(dtype, {n, k}, seed, 0.02f));
  BlockScales scales;
  scales.scales = fp8_scales_host({n, k}, 1e-4f);
  scales.block_rows = scales.block_cols = 128;
  return backend::to_device(gpu, random_fp8_host({n, k}, seed).with_block_scales(std::move(scales)));
}

}  // namespace

void projections_in_graph(backend::Context& gpu) {
  const backend::ReducedPrecisionScope bf16_model(gpu, true);
  struct Projection { const char* name; int64_t n, k; DType dtype; };
  for (const Projection p : {Projection{"qkv_proj", 5120, 2048, DType::BF16}, Projection{"qkv_proj", 5120, 2048, DType::F8_E4M3},
                             Projection{"o_proj", 2048, 4096, DType::BF16}, Projection{"o_proj", 2048, 4096, DType::F8_E4M3},
                             Projection{"router", 128, 2048, DType::F32}}) {
    std::vector<Tensor> weights(1, device_weight(gpu, p.n, p.k, p.dtype, 40));
    const auto bytes = static_cast<double>(weights[0].nbytes() +
                                           (weights[0].block_scales() ? weights[0].block_scales()->scales.nbytes() : 0));
    while (static_cast<double>(weights.size()) * bytes < kCycleBytes) {
      weights.push_back(device_weight(gpu, p.n, p.k, p.dtype, 40 + static_cast<uint32_t>(weights.size())));
    }
    for (const int64_t rows : {1, 8, 64, 256}) {  // decode batches; FP8 from 17 rows takes another path
      const Tensor x = backend::to_device(gpu, random_host(DType::F32, {rows, p.k}, 41, 1.0f));
      Tensor y = backend::device_empty(gpu, DType::F32, {rows, p.n});
      std::size_t next = 0;
      const double ms = graph_mean_ms(gpu, [&] {
        ops::linear(gpu, x, weights[next], nullptr, y);
        next = (next + 1) % weights.size();
      });
      std::printf("{\"bench\":\"projection_in_graph\",\"op\":\"%s\",\"weights\":\"%s\",\"rows\":%lld,\"MB\":%.1f,"
                  "\"us\":%.2f,\"TB_per_s\":%.3f,\"buffers\":%zu}\n",
                  p.name, std::string(dtype_name(p.dtype)).c_str(), static_cast<long long>(rows), bytes / 1e6, ms * 1e3,
                  bytes / (ms * 1e-3) / 1e12, weights.size());
    }
  }
}

}  // namespace r3::bench
