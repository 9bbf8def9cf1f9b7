// The checks of r3's output against a family's Hugging Face reference, shared by the CPU parity
// suite (test_reference_parity.cpp) and the GPU one (gpu/test_gpu_parity.cpp): the same oracle
// and tolerances whatever device produced the output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "test_support.h"

namespace r3::test {

// The ids `r3 forward` runs over (every reference input but the last), and the prompt.
std::vector<int64_t> forward_ids(const Reference& ref);
std::vector<int64_t> prompt_ids(const Reference& ref);

// A `r3 forward --dump` file against the reference: logits within 1e-4 of the largest reference
// logit, every row's expert set equal, and each expert's weight within 1e-4.
void expect_forward_dump_matches(const Reference& ref, const std::string& dump_path);

// The greedy tokens and the routed rows a reference fixes: all its generated tokens and rows, or,
// where transformers' own generate left its float64 forward (generate_agrees false), only the
// first token (the forward's argmax after the prompt) and the prompt's rows; after that the
// sequences differ by construction.
std::vector<int64_t> greedy_tokens_fixed_by(const Reference& ref);
int64_t routed_rows_fixed_by(const Reference& ref);

// The stdout of `r3 generate --json --ignore-eos` over the reference prompt: the greedy tokens
// and every routed row's expert set the reference fixes equal to it.
void expect_generate_output_matches(const Reference& ref, const std::string& json_out);

}  // namespace r3::test
