// A step's token draws done on the host, from logits rows that reached it: what a model that
// draws on its device computes (ops/token_draw.h), by the engine's own rules (choose_token,
// log_softmax, top_logprobs), so the two are interchangeable.
#pragma once

#include <span>

#include "ops/token_draw.h"

namespace r3::engine {

// The draw from one row of logits: nothing for a row that does not draw; its first non-finite
// logit (and then nothing else); or the chosen token with the log-probabilities asked for.
ops::DrawnToken draw_on_host(std::span<const float> logits, const ops::TokenDraw& draw);

}  // namespace r3::engine
