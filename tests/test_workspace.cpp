// The step workspace of the execution context: LIFO scopes, zero-filled buffers, growth that
// stops once the largest step has run, per-thread scratch.
#include <gtest/gtest.h>

#include <set>

#include "backend/context.h"

namespace r3::test {
namespace {

TEST(Workspace, ScopesReleaseInLifoOrderAndBuffersComeZeroed) {
  backend::Workspace ws;
  ws.reserve(4096);  // one chunk from the start: nothing is merged (and moved) on release
  float* first = nullptr;
  {
    backend::Workspace::Scope scope(ws);
    Tensor a = ws.tensor(DType::F32, {4, 8});
    first = a.data<float>();
    for (int64_t i = 0; i < a.numel(); ++i) first[i] = 7.0f;
    Tensor b = ws.tensor(DType::F32, {3});
    EXPECT_NE(b.data<float>(), first);
    EXPECT_GE(b.data<float>(), first + 32);  // disjoint from `a`
    EXPECT_EQ(a.storage(), Storage::kView);
  }
  backend::Workspace::Scope scope(ws);
  Tensor again = ws.tensor(DType::F32, {4, 8});
  EXPECT_EQ(again.data<float>(), first);  // the released memory is handed out again...
  for (int64_t i = 0; i < again.numel(); ++i) EXPECT_EQ(again.data<float>()[i], 0.0f);  // ...zeroed
}

TEST(Workspace, GrowsUntilTheLargestStepHasRunThenHolds) {
  backend::Workspace ws;
  auto step = [&](int64_t floats) {
    backend::Workspace::Scope scope(ws);
    for (int i = 0; i < 4; ++i) ws.array<float>(floats);
  };
  step(1000);
  step(100000);  // more than the first chunk: grows by chunks, merged when idle
  const int64_t grown = ws.growths();
  EXPECT_GE(ws.capacity(), 4 * 100000 * sizeof(float));
  for (int64_t floats : {100000, 10, 50000, 100000}) step(floats);
  EXPECT_EQ(ws.growths(), grown);
  backend::Workspace reserved;
  reserved.reserve(1 << 20);
  {
    backend::Workspace::Scope scope(reserved);
    reserved.array<float>((1 << 20) / sizeof(float));
  }
  EXPECT_EQ(reserved.growths(), 1);
}

TEST(Context, PerThreadScratchGivesEachThreadItsOwnPart) {
  backend::Context ctx(3);
  backend::Workspace::Scope scope(ctx.workspace());
  const auto scratch = ctx.per_thread<int64_t>(16);
  std::vector<int64_t> owner(64, -1);
  ctx.parallel_for(64, 1, [&](int64_t begin, int64_t end) {
    const std::span<int64_t> mine = scratch.mine();
    for (int64_t i = begin; i < end; ++i) {
      mine[0] = ThreadPool::thread_index();
      owner[static_cast<std::size_t>(i)] = (mine.data() - scratch.base) / scratch.n;
      EXPECT_EQ(owner[static_cast<std::size_t>(i)], mine[0]);
    }
  });
  for (int64_t o : owner) EXPECT_TRUE(o >= 0 && o < 3);
}

}  // namespace
}  // namespace r3::test
