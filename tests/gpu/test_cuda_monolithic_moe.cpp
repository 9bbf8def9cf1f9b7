// The monolithic MoE kernel (moe/device_monolithic_moe.h) against the modular path's kernels on random data:
// router projection, routing with capture and margins, the EPLB map with its load counts, grouped
// experts and combine. The two paths must give the same bits for every output, for 1 to 4
// tokens, replayed rows included, launch after launch (the kernel's counters start over).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "gpu/gpu_test_support.h"
#include "moe/cuda/fused_experts_of_ids.h"
#include "moe/device_experts.h"
#include "moe/device_monolithic_moe.h"
#include "moe/device_routing.h"
#include "ops/linear.h"

namespace r3::test {
namespace {

using Kind = moe::DeviceRoutingRule::Kind;

struct MonolithicCase {
  std::string name;
  moe::DeviceRoutingRule rule;
  int64_t logical = 0, h = 0, inter = 0;
  DType dtype = DType::F32;
  moe::ExpertActivation activation;
  bool biases = false;     // router and expert biases
  int64_t replicas = 0;    // extra physical experts (EPLB map on when > 0)
};

// Every output of one MoE layer's routed experts, on the host.
struct LayerOutputs {
  Tensor ids, weights, capture, margins, counts, out;
};

// Logical expert e's replicas: e itself, and for the first `replicas` experts one more
// (physical logical + e). The map's tables as the device takes them.
struct MapTables {
  std::vector<int32_t> offsets, replicas;
  MapTables(int64_t logical, int64_t extra) {
    for (int64_t e = 0; e < logical; ++e) {
      offsets.push_back(static_cast<int32_t>(replicas.size()));
      replicas.push_back(static_cast<int32_t>(e));
      if (e < extra) replicas.push_back(static_cast<int32_t>(logical + e));
    }
    offsets.push_back(static_cast<int32_t>(replicas.size()));
  }
};

class CudaMonolithicMoe : public testing::Test {
 protected:
  void SetUp() override { gpu_ = backend::Context::cuda(0); }

  // The modular path: router GEMV, routing kernel, the map on the host (the documented rule),
  // grouped experts and combine.
  LayerOutputs modular(const MonolithicCase& c, const Tensor& x, const Tensor& router, const Tensor& router_bias,
                       const moe::DeviceExperts& experts, const std::vector<int32_t>& forced,
                       const std::vector<uint8_t>& replayed, const std::vector<int32_t>& seqs) {
    const int64_t tokens = x.dim(0), k = c.rule.k, physical = c.logical + c.replicas;
    const Tensor x_d = backend::to_device(*gpu_, x);
    Tensor logits = backend::device_empty(*gpu_, DType::F32, {tokens, c.logical});
    ops::linear(*gpu_, x_d, router, router_bias.if_defined(), logits);
    Buffers b(*gpu_, c, tokens);
    const Tensor forced_d = gpu_ints(*gpu_, forced);
    const Tensor replayed_d = backend::to_device(*gpu_, Tensor::from(replayed, {tokens}));
    moe::route_on_device(*gpu_, logits, c.rule, forced_d.data<int32_t>(), replayed_d.data<uint8_t>(),
                         b.ids.data<int32_t>(), b.weights.data<float>(), b.rows());
    LayerOutputs o;
    o.ids = backend::to_host(*gpu_, b.ids);
    std::vector<int32_t> mapped(o.ids.data<int32_t>(), o.ids.data<int32_t>() + tokens * k);
    std::vector<int32_t> counts(static_cast<std::size_t>(physical), 0);
    if (c.replicas > 0) {
      const MapTables m(c.logical, c.replicas);
      for (int64_t i = 0; i < tokens * k; ++i) {
        const int32_t e = mapped[i], first = m.offsets[e], n = m.offsets[e + 1] - first;
        mapped[i] = m.replicas[first + static_cast<int32_t>(i % n)];
        if (seqs[i / k] >= 0) ++counts[mapped[i]];
      }
    }
    const Tensor physical_d = gpu_ints(*gpu_, mapped);
    Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(physical, tokens * k)});
    Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), c.inter});
    Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), c.h});
    Tensor out = backend::device_empty(*gpu_, DType::F32, {tokens, c.h});
    moe::fused_experts_of_ids(*gpu_, x_d, physical_d.data<int32_t>(), b.weights.data<float>(), k, experts, grouping,
                                 activated, expert_out, out, /*always_grouped=*/true);
    o.weights = backend::to_host(*gpu_, b.weights);
    o.capture = backend::to_host(*gpu_, b.capture);
    o.margins = backend::to_host(*gpu_, b.margins);
    o.counts = Tensor::from(counts, {physical});
    o.out = backend::to_host(*gpu_, out);
    return o;
  }

  // The monolithic kernel, `launches` times over the same inputs (the last launch's outputs).
  LayerOutputs monolithic(const MonolithicCase& c, const Tensor& x, const Tensor& router, const Tensor& router_bias,
                    const moe::DeviceExperts& experts, const std::vector<int32_t>& forced,
                    const std::vector<uint8_t>& replayed, const std::vector<int32_t>& seqs, int launches) {
    const int64_t tokens = x.dim(0), k = c.rule.k, physical = c.logical + c.replicas;
    const Tensor x_d = backend::to_device(*gpu_, x);
    Buffers b(*gpu_, c, tokens);
    const Tensor forced_d = gpu_ints(*gpu_, forced), seqs_d = gpu_ints(*gpu_, seqs);
    const Tensor replayed_d = backend::to_device(*gpu_, Tensor::from(replayed, {tokens}));
    const MapTables m(c.logical, c.replicas);
    const Tensor offsets_d = gpu_ints(*gpu_, m.offsets), replicas_d = gpu_ints(*gpu_, m.replicas);
    Tensor counts_d = backend::device_empty(*gpu_, DType::I32, {physical});
    Tensor scratch =
        backend::device_empty(*gpu_, DType::F32, {moe::monolithic_moe_scratch_floats(experts, tokens, c.logical, k)});
    Tensor out = backend::device_empty(*gpu_, DType::F32, {tokens, c.h});
    moe::MonolithicMoeStep s;
    s.hidden = &x_d;
    s.router = &router;
    s.router_bias = router_bias.if_defined();
    s.rule = c.rule;
    s.forced = forced_d.data<int32_t>();
    s.replayed = replayed_d.data<uint8_t>();
    s.capture = b.rows();
    if (c.replicas > 0) s.map = {offsets_d.data<int32_t>(), replicas_d.data<int32_t>(), seqs_d.data<int32_t>(),
                                 counts_d.data<int32_t>()};
    s.ids = b.ids.data<int32_t>();
    s.weights = b.weights.data<float>();
    for (int i = 0; i < launches; ++i) {
      backend::fill_zero(*gpu_, counts_d);
      moe::monolithic_moe_on_device(*gpu_, s, experts, *sync_, scratch, out);
    }
    LayerOutputs o;
    o.ids = backend::to_host(*gpu_, b.ids);
    o.weights = backend::to_host(*gpu_, b.weights);
    o.capture = backend::to_host(*gpu_, b.capture);
    o.margins = backend::to_host(*gpu_, b.margins);
    o.counts = c.replicas > 0 ? backend::to_host(*gpu_, counts_d) : Tensor::from(std::vector<int32_t>(physical, 0), {physical});
    o.out = backend::to_host(*gpu_, out);
    return o;
  }

  // The routing outputs, in a capture buffer of 3 layers written at layer 1 (rows of the other
  // layers must stay as filled: -7).
  struct Buffers {
    static constexpr int64_t kLayers = 3, kLayer = 1;
    Tensor ids, weights, capture, margins;
    int64_t k;
    Buffers(backend::Context& gpu, const MonolithicCase& c, int64_t tokens) : k(c.rule.k) {
      ids = backend::device_empty(gpu, DType::I32, {tokens, k});
      weights = backend::device_empty(gpu, DType::F32, {tokens, k});
      capture = backend::to_device(gpu, Tensor::from(std::vector<int32_t>(tokens * kLayers * k, -7), {tokens, kLayers, k}));
      margins = backend::to_device(gpu, Tensor::from(std::vector<float>(tokens * kLayers, -7.0f), {tokens, kLayers}));
    }
    moe::DeviceCaptureRows rows() {
      return {capture.data<int32_t>() + kLayer * k, kLayers * k, margins.data<float>() + kLayer, kLayers};
    }
  };

  std::unique_ptr<backend::Context> gpu_;
  std::unique_ptr<moe::MonolithicMoeSync> sync_;  // one for every launch of the test, as a layer has
};

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0) << what << " differs";
}

TEST_F(CudaMonolithicMoe, GivesTheModularPathsBitsForEveryOutput) {
  std::vector<float> bias(256);
  std::mt19937 rng(90);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (float& b : bias) b = normal(rng);
  const Tensor bias_d = backend::to_device(*gpu_, Tensor::from(bias, {256}));
  moe::ExpertActivation gpt_oss;
  gpt_oss.kind = moe::ExpertActivation::Kind::kGptOss;
  gpt_oss.limit = 7.0f;
  const std::vector<MonolithicCase> cases = {
      {"softmax top-8 of 64, bf16", {Kind::kSoftmaxTopK, 8, true}, 64, 128, 96, DType::BF16, {}, false, 0},
      {"softmax top-8 of 64, float32, EPLB map", {Kind::kSoftmaxTopK, 8, true}, 64, 128, 96, DType::F32, {}, false, 5},
      {"grouped sigmoid top-8 of 256, bf16, EPLB map",
       {Kind::kSigmoidGroupTopK, 8, true, 8, 4, 2.5f, bias_d.data<float>()}, 256, 64, 32, DType::BF16, {}, false, 9},
      {"top-4 softmax of 32, GPT-OSS activation, biases", {Kind::kTopKSoftmax, 4}, 32, 72, 40, DType::F32, gpt_oss,
       true, 0},
      {"softmax top-2 of 8, bf16, biases", {Kind::kSoftmaxTopK, 2, false}, 8, 64, 24, DType::BF16, {}, true, 2},
  };
  sync_ = std::make_unique<moe::MonolithicMoeSync>(*gpu_);
  for (const MonolithicCase& c : cases) {
    const int64_t physical = c.logical + c.replicas, k = c.rule.k;
    const Tensor router = backend::to_device(*gpu_, gpu_random({c.logical, c.h}, 91, 0.3f));
    const Tensor router_bias = c.biases ? backend::to_device(*gpu_, gpu_random({c.logical}, 92, 0.1f)) : Tensor();
    moe::DeviceExperts experts;
    experts.gate = backend::to_device_as(*gpu_, gpu_random({physical, c.inter, c.h}, 93, 0.2f), c.dtype);
    experts.up = backend::to_device_as(*gpu_, gpu_random({physical, c.inter, c.h}, 94, 0.2f), c.dtype);
    experts.down = backend::to_device_as(*gpu_, gpu_random({physical, c.h, c.inter}, 95, 0.2f), c.dtype);
    if (c.biases) {
      experts.gate_bias = backend::to_device(*gpu_, gpu_random({physical, c.inter}, 96, 0.1f));
      experts.up_bias = backend::to_device(*gpu_, gpu_random({physical, c.inter}, 97, 0.1f));
      experts.down_bias = backend::to_device(*gpu_, gpu_random({physical, c.h}, 98, 0.1f));
    }
    experts.activation = c.activation;
    for (int64_t tokens = 1; tokens <= moe::kPairMajorTokens; ++tokens) {
      SCOPED_TRACE(c.name + ", " + std::to_string(tokens) + " tokens");
      ASSERT_TRUE(moe::monolithic_moe_fits(experts, tokens));
      const Tensor x = gpu_random({tokens, c.h}, 100 + static_cast<uint32_t>(tokens));
      // The second token replays the k last experts in reverse order; the third is padding
      // (routed and run, not counted).
      std::vector<int32_t> forced(static_cast<std::size_t>(tokens * k)), seqs(static_cast<std::size_t>(tokens));
      std::vector<uint8_t> replayed(static_cast<std::size_t>(tokens), 0);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < k; ++j) forced[t * k + j] = static_cast<int32_t>(c.logical - 1 - j);
        replayed[t] = t == 1 ? 1 : 0;
        seqs[t] = t == 2 ? -1 : static_cast<int32_t>(t);
      }
      const LayerOutputs want = modular(c, x, router, router_bias, experts, forced, replayed, seqs);
      const LayerOutputs got = monolithic(c, x, router, router_bias, experts, forced, replayed, seqs, 3);
      expect_same_bits(got.ids, want.ids, "logical ids");
      expect_same_bits(got.weights, want.weights, "routing weights");
      expect_same_bits(got.capture, want.capture, "capture rows");
      expect_same_bits(got.margins, want.margins, "margins");
      expect_same_bits(got.counts, want.counts, "load counts");
      expect_same_bits(got.out, want.out, "output");
      if (tokens > 1) {
        EXPECT_EQ(got.ids.data<int32_t>()[k], c.logical - 1) << "the replayed row";
      }
    }
  }
}

// Steps too large for one kernel, or rows without eight-value loads, are left to the modular path.
TEST_F(CudaMonolithicMoe, TakesOnlyDecodeStepsOfAFewTokens) {
  moe::DeviceExperts experts;
  experts.gate = backend::to_device_as(*gpu_, gpu_random({4, 16, 64}, 1), DType::BF16);
  experts.up = experts.gate;
  experts.down = backend::to_device_as(*gpu_, gpu_random({4, 64, 16}, 2), DType::BF16);
  EXPECT_TRUE(moe::monolithic_moe_fits(experts, 1));
  EXPECT_TRUE(moe::monolithic_moe_fits(experts, moe::kPairMajorTokens));
  EXPECT_FALSE(moe::monolithic_moe_fits(experts, moe::kPairMajorTokens + 1));
  EXPECT_FALSE(moe::monolithic_moe_fits(experts, 0));
  moe::DeviceExperts odd;
  odd.gate = backend::to_device_as(*gpu_, gpu_random({4, 12, 60}, 3), DType::BF16);
  odd.up = odd.gate;
  odd.down = backend::to_device_as(*gpu_, gpu_random({4, 60, 12}, 4), DType::BF16);
  EXPECT_FALSE(moe::monolithic_moe_fits(odd, 1));
}

}  // namespace
}  // namespace r3::test
