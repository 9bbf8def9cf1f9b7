// What a step draws from each logits row, and what it hands back, when the model draws the next
// tokens itself (a device model: the [rows, vocab] logits then never leave the GPU, only these
// few bytes per row do). The rule is engine::choose_token's (engine/sampler.h), so a model that
// draws and the host drawing from the same logits pick the same token; the log-probabilities are
// engine::log_softmax's (engine/logprobs.h).
#pragma once

#include <cstdint>
#include <vector>

namespace r3::ops {

struct TokenDraw {
  bool draws = true;         // false: the row is not sampled (a prompt chunk that does not end the prompt)
  double temperature = 0.0;  // 0: greedy (the largest logit, the lowest id on ties)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;
  double min_p = 0.0;
  double uniform = 0.0;      // [0, 1): the request's draw for this step (engine::Sampler::draw)
  int64_t logprobs = -1;     // -1: none; 0: the chosen token's; n: also the n most likely tokens
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct DrawnToken {
  int32_t token = -1;
  float logprob = 0;               // with logprobs >= 0
  std::vector<TokenLogprob> top;   // with logprobs > 0: highest first, the lower id first on ties
  // The lowest token id whose logit is not finite, and that logit; -1 when all are finite (the
  // row is then not drawn from: token stays -1).
  int32_t nonfinite_token = -1;
  float nonfinite_value = 0;
};

}  // namespace r3::ops
