// Kernels never allocate: once a step of a given size has run, a decode step of the model (every
// layer, the routers, capture into the step's buffer, the EPLB map and load counts, the experts
// on each MoE path, attention over the paged cache, the lm_head into the caller's logits) makes
// no heap allocation. Its own binary, because it replaces the global operator new with a
// counting one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "backend/context.h"
#include "models/registry.h"
#include "moe/expert_loads.h"
#include "moe/routing_capturer.h"
#include "test_support.h"

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

// The replacements pair malloc/aligned_alloc with free, which GCC cannot see through.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t align) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t align) { return operator new(n, align); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace r3::test {
namespace {

// Heap allocations made while `fn` runs (on any thread).
template <typename Fn>
long count_allocations(Fn&& fn) {
  allocations = 0;
  counting = true;
  fn();
  counting = false;
  return allocations.load();
}

TEST(ZeroAlloc, TheCounterSeesAllocations) {  // the hook is live: a zero below means something
  const long n = count_allocations([] {
    void* p = ::operator new(64);  // a call, not a new-expression: the compiler may not elide it
    ::operator delete(p);
  });
  EXPECT_EQ(n, 1);
}

struct Case {
  std::string family;
  moe::MoePath path;
  bool replicas;  // EPLB with redundant experts (replicas are copies: another code path)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.family + "_" + std::string(moe::moe_path_name(info.param.path)) +
         (info.param.replicas ? "_replicas" : "");
}

class ZeroAllocDecode : public ::testing::TestWithParam<Case> {};

// Two sequences: a prefill of both, then decode steps of one token each; one sequence replays a
// routing (its own, captured in the previous step), the other routes freely. The third decode
// step is counted.
TEST_P(ZeroAllocDecode, WarmDecodeStepMakesNoHeapAllocation) {
  const Case& c = GetParam();
  models::LoadOptions options;
  options.moe_path = c.path;
  if (c.replicas) options.eplb.redundant_experts = 2;
  auto model = models::load_model(family_dir(c.family), options);
  const models::ModelInfo& info = model->info();
  backend::Context ctx(2);
  auto cache = model->make_cache(2, 64);
  const auto layers = static_cast<int64_t>(info.moe_layers.size());
  moe::RoutingCapturer capturer(16, layers, info.top_k, info.num_experts);
  std::vector<int64_t> physical;
  for (moe::MoeBlock* block : model->moe_blocks()) physical.push_back(block->experts().num_physical());
  moe::ExpertLoads loads(physical);

  models::ForwardBatch prefill;
  for (int32_t seq = 0; seq < 2; ++seq) {
    for (int32_t p = 0; p < 5; ++p) {
      prefill.token_ids.push_back(3 + 7 * p + seq);
      prefill.positions.push_back(p);
      prefill.seqs.push_back(seq);
    }
  }
  prefill.logit_rows = {4, 9};
  prefill.capture = &capturer;
  prefill.loads = &loads;
  Tensor logits = Tensor::empty(DType::F32, {2, info.vocab_size});
  capturer.begin_step(prefill.size());
  model->forward_into(ctx, prefill, *cache, logits);
  capturer.end_step();

  // The decode batch is built once and reused: only its positions and ids change.
  models::ForwardBatch decode;
  decode.token_ids = {11, 12};
  decode.positions = {5, 5};
  decode.seqs = {0, 1};
  decode.capture = &capturer;
  decode.loads = &loads;
  decode.forced_routing.assign(static_cast<std::size_t>(2 * layers * info.top_k), 0);
  decode.replayed = {1, 0};
  for (int step = 0; step < 3; ++step) {
    // Sequence 0 replays the routing its row 0 had in the previous step (a valid routing).
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t k = 0; k < info.top_k; ++k) {
        decode.forced_routing[static_cast<std::size_t>(l * info.top_k + k)] = capturer.id(0, l, k);
      }
    }
    loads.clear();
    capturer.begin_step(decode.size());
    const long n = count_allocations([&] { model->forward_into(ctx, decode, *cache, logits); });
    capturer.end_step();
    if (step == 2) {
      EXPECT_EQ(n, 0) << "heap allocations in a warmed-up decode step";
    }
    decode.positions = {decode.positions[0] + 1, decode.positions[1] + 1};
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string family : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "deepseek_v2",
                                   "deepseek_v3", "gpt_oss", "deepseek_v4", "deepseek_v4_yarn", "kimi_linear",
                                   "kimi_k3"}) {
    for (moe::MoePath path : {moe::MoePath::kModular, moe::MoePath::kMonolithic, moe::MoePath::kMega}) {
      out.push_back({family, path, false});
    }
    out.push_back({family, moe::MoePath::kMega, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, ZeroAllocDecode, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace r3::test
