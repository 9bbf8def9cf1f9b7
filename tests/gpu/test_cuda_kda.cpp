// Kimi Delta Attention's CUDA kernels (ops/cuda/sm90_short_conv.cu, ops/cuda/sm90_delta_rule.cu)
// against the CPU ops they stand for, over one step that mixes decodes, prefills of several rows
// and a padding row, with states that are not zero: the outputs, and every sequence slot's conv
// and recurrent states after the step (the slot no row touched included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "gpu/gpu_test_support.h"
#include "ops/delta_rule.h"
#include "ops/short_conv.h"

namespace r3::test {
namespace {

struct KdaCase {
  int64_t heads, dim, kernel;
  bool stacked;      // q, k and v as columns of one projection (else three tensors)
  bool bounded;      // Kimi K3's forget gate
};

TEST(CudaKda, ShortConvolutionAndDeltaRuleMatchTheCpuOverAMixedStep) {
  auto gpu = backend::Context::cuda(0);
  for (const KdaCase c : {KdaCase{4, 16, 4, true, false}, KdaCase{2, 128, 4, false, false}, KdaCase{3, 64, 1, true, true},
                          KdaCase{32, 128, 4, true, false}, KdaCase{2, 40, 3, false, true}}) {
    SCOPED_TRACE(testing::Message() << c.heads << " heads of " << c.dim << ", " << c.kernel << " taps"
                                    << (c.stacked ? ", stacked" : "") << (c.bounded ? ", bounded gate" : ""));
    const int64_t width = c.heads * c.dim, kept = c.kernel - 1, slots = 5;
    // Slot 0 decodes, slot 1 takes 5 rows, a padding row, slot 2 decodes, slot 3 takes 2 rows;
    // slot 4 is untouched.
    const std::vector<int32_t> seqs = {0, 1, 1, 1, 1, 1, -1, 2, 3, 3}, positions = {7, 0, 1, 2, 3, 4, 0, 30, 9, 10};
    const auto tokens = static_cast<int64_t>(seqs.size());
    const Tensor qkv = gpu_random({tokens, 3 * width}, 1, 1.0f);
    const Tensor taps = gpu_random({3 * width, c.kernel}, 2, 0.5f);
    const Tensor conv_state = gpu_random({slots, 3 * width * std::max<int64_t>(kept, 1)}, 3, 1.0f);
    const Tensor f = gpu_random({tokens, width}, 4, 1.0f), beta = gpu_random({tokens, c.heads}, 5, 1.0f);
    const Tensor gate = gpu_random({tokens, width}, 6, 1.0f), a_log = gpu_random({c.heads}, 7, 0.5f);
    const Tensor dt_bias = gpu_random({width}, 8, 0.5f), norm = gpu_random({c.dim}, 9, 1.0f);
    const Tensor rec_state = gpu_random({slots, c.heads * c.dim * c.dim}, 10, 0.1f);
    const float lower_bound = -5.0f, eps = 1e-6f;

    // The device: q, k and v stacked in one tensor, or apart.
    Tensor q_part = Tensor::empty(DType::F32, {tokens, width}), k_part = Tensor::empty(DType::F32, {tokens, width}),
           v_part = Tensor::empty(DType::F32, {tokens, width});
    Tensor* parts[3] = {&q_part, &k_part, &v_part};
    for (int64_t t = 0; t < tokens; ++t) {
      for (int i = 0; i < 3; ++i) {
        std::copy_n(qkv.data<float>() + t * 3 * width + i * width, width, parts[i]->data<float>() + t * width);
      }
    }
    const Tensor qkv_d = backend::to_device(*gpu, qkv), q_d = backend::to_device(*gpu, q_part),
                 k_d = backend::to_device(*gpu, k_part), v_d = backend::to_device(*gpu, v_part);
    const Tensor taps_d = backend::to_device(*gpu, taps), f_d = backend::to_device(*gpu, f);
    const Tensor beta_d = backend::to_device(*gpu, beta), gate_d = backend::to_device(*gpu, gate);
    const Tensor a_log_d = backend::to_device(*gpu, a_log), dt_bias_d = backend::to_device(*gpu, dt_bias);
    const Tensor norm_d = backend::to_device(*gpu, norm);
    Tensor conv_state_d = backend::to_device(*gpu, conv_state), rec_state_d = backend::to_device(*gpu, rec_state);
    const Tensor seqs_d = gpu_ints(*gpu, seqs), positions_d = gpu_ints(*gpu, positions);
    const ops::StepView step{tokens, nullptr, positions_d.data<int32_t>(), seqs_d.data<int32_t>(), nullptr, 0, 31};
    ops::ConvInputs in;
    in.parts = 3;
    in.part_channels = width;
    if (c.stacked) {
      for (int i = 0; i < 3; ++i) in.part[i] = qkv_d.data<float>() + i * width;
      in.stride = 3 * width;
    } else {
      in.part[0] = q_d.data<float>();
      in.part[1] = k_d.data<float>();
      in.part[2] = v_d.data<float>();
      in.stride = width;
    }
    Tensor convolved_d = backend::device_empty(*gpu, DType::F32, {tokens, 3 * width});
    ops::cuda::short_conv_silu_step(*gpu, in, taps_d.data<float>(), c.kernel, step, conv_state_d.data<float>(),
                                    convolved_d.data<float>());
    const float* conv_out = convolved_d.data<float>();
    const ops::DeltaRuleStepRows rows{conv_out, conv_out + width, conv_out + 2 * width, 3 * width,
                                            f_d.data<float>(), beta_d.data<float>(), gate_d.data<float>()};
    ops::DeltaRuleHeadWeights weights;
    weights.a_log = a_log_d.data<float>();
    weights.dt_bias = dt_bias_d.data<float>();
    weights.norm = norm_d.data<float>();
    weights.eps = eps;
    weights.bounded = c.bounded;
    weights.lower_bound = lower_bound;
    // Every row, padding included, is the kernel's to write: they start as NaN.
    Tensor nans = Tensor::empty(DType::F32, {tokens, width});
    std::fill(nans.data<float>(), nans.data<float>() + nans.numel(), NAN);
    Tensor out_d = backend::to_device(*gpu, nans);
    ops::cuda::gated_delta_rule_step(*gpu, c.heads, c.dim, rows, weights, step, rec_state_d.data<float>(),
                                     out_d.data<float>());
    const Tensor convolved = backend::to_host(*gpu, convolved_d), out = backend::to_host(*gpu, out_d);
    const Tensor conv_after = backend::to_host(*gpu, conv_state_d), rec_after = backend::to_host(*gpu, rec_state_d);

    // The CPU, one run at a time, on copies of the states.
    Tensor want_conv_state = Tensor::empty(DType::F32, conv_state.shape()), want_rec = Tensor::empty(DType::F32, rec_state.shape());
    std::memcpy(want_conv_state.raw_data(), conv_state.raw_data(), conv_state.nbytes());
    std::memcpy(want_rec.raw_data(), rec_state.raw_data(), rec_state.nbytes());
    const ops::DeltaRuleShape shape{c.heads, c.dim, c.dim};
    for (int64_t first = 0; first < tokens;) {
      const int32_t seq = seqs[static_cast<std::size_t>(first)];
      int64_t end = first + 1;
      while (end < tokens && seqs[static_cast<std::size_t>(end)] == seq) ++end;
      if (seq < 0) {
        for (int64_t j = 0; j < width; ++j) EXPECT_EQ(out.data<float>()[first * width + j], 0.0f) << "padding row";
        first = end;
        continue;
      }
      const int64_t n = end - first;
      Tensor conv_want[3], g = Tensor::empty(DType::F32, {n, width}), b = Tensor::empty(DType::F32, {n, c.heads});
      for (int i = 0; i < 3; ++i) {
        conv_want[i] = Tensor::empty(DType::F32, {n, width});
        ops::short_conv_silu(parts[i]->data<float>() + first * width, n, width, taps.data<float>() + i * width * c.kernel,
                             c.kernel, want_conv_state.data<float>() + seq * 3 * width * std::max<int64_t>(kept, 1) + i * width * kept,
                             conv_want[i].data<float>());
        for (int64_t t = 0; t < n; ++t) {
          EXPECT_LT(gpu_relative_error(convolved.data<float>() + (first + t) * 3 * width + i * width,
                                       conv_want[i].data<float>() + t * width, width),
                    1e-6)
              << "convolution of part " << i << ", row " << first + t;
        }
      }
      ops::delta_rule_log_decay(f.data<float>() + first * width, n, shape, a_log.data<float>(), dt_bias.data<float>(),
                                c.bounded ? &lower_bound : nullptr, g.data<float>());
      for (int64_t e = 0; e < n * c.heads; ++e) {
        b.data<float>()[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(beta.data<float>()[first * c.heads + e]))));
      }
      Tensor core = Tensor::empty(DType::F32, {n, width});
      const ops::DeltaRuleRows cpu_rows{conv_want[0].data<float>(), conv_want[1].data<float>(), conv_want[2].data<float>(),
                                        g.data<float>(), b.data<float>(), n, core.data<float>()};
      ops::delta_rule_recurrent(shape, cpu_rows, want_rec.data<float>() + seq * c.heads * c.dim * c.dim);
      ops::gated_rms_norm_heads(core.data<float>(), gate.data<float>() + first * width, norm.data<float>(), n, c.heads,
                                c.dim, eps, core.data<float>());
      EXPECT_LT(gpu_relative_error(out.data<float>() + first * width, core.data<float>(), n * width), 2e-5)
          << "output of slot " << seq;
      first = end;
    }
    EXPECT_EQ(std::memcmp(conv_after.raw_data(), want_conv_state.raw_data(), conv_state.nbytes()), 0)
        << "conv states (the last inputs of each channel)";
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t n = c.heads * c.dim * c.dim;
      EXPECT_LT(gpu_relative_error(rec_after.data<float>() + s * n, want_rec.data<float>() + s * n, n), 2e-5)
          << "recurrent state of slot " << s;
    }
    EXPECT_EQ(std::memcmp(rec_after.data<float>() + 4 * c.heads * c.dim * c.dim,
                          rec_state.data<float>() + 4 * c.heads * c.dim * c.dim,
                          sizeof(float) * static_cast<std::size_t>(c.heads * c.dim * c.dim)),
              0)
        << "the untouched slot's state";
  }
}

}  // namespace
}  // namespace r3::test
