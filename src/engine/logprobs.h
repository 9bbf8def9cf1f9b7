// Log-probabilities of the raw model distribution: the softmax of the logits as the model wrote
// them, before temperature and any filtering (what vLLM returns by default), and the n most
// likely tokens of a row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/token_draw.h"

namespace r3::engine {

// out[i] = logits[i] - log(sum_j exp(logits[j])), max-subtracted and summed in double so that a
// vocabulary of 10^5 or logits of any magnitude lose no precision. out must be as long as logits.
void log_softmax(std::span<const float> logits, std::span<float> out);

using TokenLogprob = ops::TokenLogprob;

// The n largest logprobs, highest first, the lower token id first on ties; n is clamped to the
// vocabulary size and n <= 0 gives none.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logprobs, int64_t n);

}  // namespace r3::engine
