// The execution context's step settings: reduced precision is set per scope (a model's step) and
// restored after, so models of both dtypes can share one context.
#include <gtest/gtest.h>

#include "backend/context.h"

namespace r3::test {
namespace {

TEST(Context, ReducedPrecisionHoldsForItsScopeAndIsRestoredAfter) {
  backend::Context ctx(1);
  EXPECT_FALSE(ctx.reduced_precision());  // float32 activations unless a model asks
  {
    const backend::ReducedPrecisionScope bf16_model(ctx, true);
    EXPECT_TRUE(ctx.reduced_precision());
    {
      const backend::ReducedPrecisionScope f32_model(ctx, false);
      EXPECT_FALSE(ctx.reduced_precision());
    }
    EXPECT_TRUE(ctx.reduced_precision());
  }
  EXPECT_FALSE(ctx.reduced_precision());
}

}  // namespace
}  // namespace r3::test
