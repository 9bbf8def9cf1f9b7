// Kimi K3's CUDA ops against their CPU forms on random data: the attention-residual mix
// (ops/cuda/sm90_residual_mix.cu against AttentionResidual::mix), the SiTU activation and the
// sigmoid gate of its latent attention (ops/cuda/sm90_activation.cu against ops::cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "gpu/gpu_test_support.h"
#include "models/kimi_k3/attention_residual.h"
#include "ops/activation.h"
#include "ops/residual_mix.h"

namespace r3::test {
namespace {

TEST(CudaKimiK3, ResidualMixMatchesTheCpu) {
  auto gpu = backend::Context::cuda(0);
  backend::Context cpu(2);
  for (const int64_t hidden : {64, 1000, 7168}) {
    for (const int64_t count : {0, 1, 3, 9}) {
      const int64_t tokens = 5, room = 10;  // snapshots hold more blocks than are taken
      const Tensor query = gpu_random({hidden}, 1, 1.0f), norm = gpu_random({hidden}, 2, 1.0f);
      const Tensor snapshots = gpu_random({room, tokens, hidden}, 3, 2.0f), current = gpu_random({tokens, hidden}, 4, 2.0f);
      const models::AttentionResidual host(query, norm, 1e-6f);
      Tensor want = Tensor::empty(DType::F32, {tokens, hidden});
      host.mix(cpu, snapshots, count, current, want);
      const Tensor query_d = backend::to_device(*gpu, query), norm_d = backend::to_device(*gpu, norm);
      const Tensor snapshots_d = backend::to_device(*gpu, snapshots), current_d = backend::to_device(*gpu, current);
      Tensor out_d = backend::device_empty(*gpu, DType::F32, {tokens, hidden});
      ops::cuda::residual_mix(*gpu, query_d.data<float>(), norm_d.data<float>(), 1e-6f, snapshots_d.data<float>(), count,
                              tokens * hidden, current_d.data<float>(), tokens, hidden, out_d.data<float>());
      EXPECT_LT(gpu_relative_error(backend::to_host(*gpu, out_d), want), 1e-6) << hidden << " wide, " << count
                                                                               << " snapshots";
    }
  }
}

TEST(CudaKimiK3, SituAndSigmoidGateMatchTheCpu) {
  auto gpu = backend::Context::cuda(0);
  backend::Context cpu(2);
  const Tensor gate = gpu_random({7, 300}, 5, 4.0f), up = gpu_random({7, 300}, 6, 4.0f);
  const Tensor gate_d = backend::to_device(*gpu, gate), up_d = backend::to_device(*gpu, up);
  for (const float linear_beta : {INFINITY, 3.0f}) {
    Tensor want = Tensor::empty(DType::F32, {7, 300});
    ops::situ_and_mul(cpu, gate, up, want, 4.0f, linear_beta);
    Tensor got_d = backend::device_empty(*gpu, DType::F32, {7, 300});
    ops::situ_and_mul(*gpu, gate_d, up_d, got_d, 4.0f, linear_beta);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu, got_d), want), 1e-6) << "linear_beta " << linear_beta;
  }
  Tensor want = Tensor::empty(DType::F32, {7, 300});
  std::copy_n(up.data<float>(), up.numel(), want.data<float>());
  ops::mul_sigmoid(cpu, gate, want);
  Tensor got_d = backend::to_device(*gpu, up);
  ops::mul_sigmoid(*gpu, gate_d, got_d);
  EXPECT_LT(gpu_relative_error(backend::to_host(*gpu, got_d), want), 1e-6);
}

}  // namespace
}  // namespace r3::test
