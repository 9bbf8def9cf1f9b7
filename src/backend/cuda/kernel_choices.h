// The GPU kernel choices that depend on a step's shape or its weights' dtype, in one place: each
// is made by its rule (the *_taken functions below, the default), and an engine option
// (`r3 ... --device cuda --kernel-choice NAME=VALUE`, Context::set_kernel_choice) may force it
// either way, to measure one side against the other on another GPU or model shape. Kernels ask
// their context's CUDA state (State::choices); nothing is read from the environment. Each choice
// is made only where both of its kernels can run (the caller checks that they fit).
//
// The table (name: what is chosen; its rule):
// - cluster_merge: attention on tensor cores with up to 16 chunks merges each (token, group of
//   heads)'s chunks inside the attention kernel, the chunks' blocks a thread-block cluster,
//   instead of in the merge kernel after it. Rule: when attention's grid is at most one block an
//   SM. The cluster removes a kernel from the step's chain but lengthens attention; past one wave
//   of blocks that costs more than it saves. Same bits either way.
// - gate_up_one_wave: gate/up at one token with two groups of eight in flight a row under six
//   blocks an SM, so that one wave of blocks holds every (pair, intermediate row) of a
//   Qwen3-30B-A3B layer. Rule: FP8 weights (bfloat16 keeps the default shape, the faster one
//   for it). Same bits either way.
// - down_rows_in_flight: down + combine at one token with eight (FP8) or four (bfloat16) hidden
//   rows a block, every choice's rows loaded before the kernel waits for gate/up, instead of a
//   block a row. Rule: FP8 weights whose scales fit the lanes (bfloat16's rows are twice as long
//   and spill at four rows a block). Only where down_rows_in_flight_fit. Same bits either way.
// - down_six_blocks: down + combine at one token a block a row (where rows in flight is not
//   taken) held to six blocks an SM, in fewer waves at the cost of some spills. Rule: FP8 weights
//   whose scales fit the lanes (forced off, they are held to four); bfloat16, whose rows are twice
//   as long, otherwise takes no bound. Same bits either way.
//
// This file is plain C++ (no CUDA headers), so that options naming a choice are checked in any
// build, before a device is opened.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace r3::backend::cuda {

// How a choice is made: by its rule, or forced either way.
enum class Choice : uint8_t { kRule, kAlways, kNever };

struct KernelChoices {
  Choice cluster_merge = Choice::kRule;
  Choice gate_up_one_wave = Choice::kRule;
  Choice down_rows_in_flight = Choice::kRule;
  Choice down_six_blocks = Choice::kRule;

  // Whether a choice is taken where its rule says `by_rule`.
  static bool taken(Choice choice, bool by_rule) {
    return choice == Choice::kRule ? by_rule : choice == Choice::kAlways;
  }

  // The rules, each as the table above says, unless forced.
  bool cluster_merge_taken(int64_t blocks, int sm_count) const { return taken(cluster_merge, blocks <= sm_count); }
  bool gate_up_one_wave_taken(bool fp8) const { return taken(gate_up_one_wave, fp8); }
  // fp8: FP8 rows whose scales fit the lanes (the only FP8 rows that kernel takes).
  bool down_rows_in_flight_taken(bool fp8) const { return taken(down_rows_in_flight, fp8); }
  bool down_six_blocks_taken(bool fp8_lane_scales) const { return taken(down_six_blocks, fp8_lane_scales); }

  // Sets the choice `name` to `value` ("rule", "always" or "never"). Throws r3::Error naming the
  // known choices (an unknown name) or values (an unknown value).
  void set(std::string_view name, std::string_view value);
  // The same from "NAME=VALUE" (the command line's form).
  void set(std::string_view setting);

  // The choices' names, comma-separated, and the values each takes (for messages and help).
  static std::string names();
  static constexpr std::string_view kValues = "rule, always, never";
};

}  // namespace r3::backend::cuda
