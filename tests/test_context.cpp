// The execution context's step settings: reduced precision is set per scope (a model's step) and
// restored after, so models of both dtypes can share one context. The GPU kernel choices are set
// by name, and unknown names or values are refused with the known ones.
#include <gtest/gtest.h>

#include "backend/context.h"
#include "backend/cuda/kernel_choices.h"
#include "test_support.h"

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

TEST(Context, KernelChoicesAreSetByNameAndUnknownOnesRefused) {
  using backend::cuda::Choice;
  using backend::cuda::KernelChoices;
  EXPECT_TRUE(KernelChoices::taken(Choice::kRule, true));
  EXPECT_FALSE(KernelChoices::taken(Choice::kRule, false));
  EXPECT_TRUE(KernelChoices::taken(Choice::kAlways, false));
  EXPECT_FALSE(KernelChoices::taken(Choice::kNever, true));
  KernelChoices choices;
  EXPECT_EQ(choices.cluster_merge, Choice::kRule);
  EXPECT_EQ(choices.down_six_blocks, Choice::kRule);
  choices.set("cluster_merge=never");
  choices.set("gate_up_one_wave", "always");
  choices.set("down_rows_in_flight=always");
  choices.set("down_rows_in_flight=rule");
  EXPECT_EQ(choices.cluster_merge, Choice::kNever);
  EXPECT_EQ(choices.gate_up_one_wave, Choice::kAlways);
  EXPECT_EQ(choices.down_rows_in_flight, Choice::kRule);
  EXPECT_EQ(choices.down_six_blocks, Choice::kRule);
  const std::string names = "cluster_merge, gate_up_one_wave, down_rows_in_flight, down_six_blocks";
  EXPECT_EQ(KernelChoices::names(), names);
  EXPECT_EQ(error_of([&] { choices.set("turbo=never"); }), "unknown kernel choice 'turbo' (known: " + names + ")");
  EXPECT_EQ(error_of([&] { choices.set("cluster_merge=sometimes"); }),
            "kernel choice cluster_merge: unknown value 'sometimes' (known: rule, always, never)");
  EXPECT_NE(error_of([&] { choices.set("cluster_merge"); }).find("expected NAME=VALUE"), std::string::npos);
  EXPECT_EQ(choices.cluster_merge, Choice::kNever);  // a refused setting changes nothing
  backend::Context cpu(1);
  EXPECT_EQ(error_of([&] { cpu.set_kernel_choice("cluster_merge", "never"); }),
            "kernel choices apply to a CUDA context");
}

}  // namespace
}  // namespace r3::test
