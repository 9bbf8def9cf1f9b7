#include "engine/host_draw.h"

#include <cmath>
#include <vector>

#include "engine/logprobs.h"
#include "engine/sampler.h"

namespace r3::engine {

namespace {

// The sampling parameters a draw applies (the seed is not one: the draw carries its uniform).
SamplingParams sampling_of(const ops::TokenDraw& draw) {
  SamplingParams p;
  p.temperature = draw.temperature;
  p.top_k = draw.top_k;
  p.top_p = draw.top_p;
  p.min_p = draw.min_p;
  return p;
}

}  // namespace

ops::DrawnToken draw_on_host(std::span<const float> logits, const ops::TokenDraw& draw) {
  ops::DrawnToken out;
  if (!draw.draws) return out;
  for (std::size_t v = 0; v < logits.size(); ++v) {
    if (!std::isfinite(logits[v])) {
      out.nonfinite_token = static_cast<int32_t>(v);
      out.nonfinite_value = logits[v];
      return out;
    }
  }
  out.token = choose_token(logits, sampling_of(draw), draw.uniform);
  if (draw.logprobs >= 0) {
    std::vector<float> lp(logits.size());
    log_softmax(logits, lp);
    out.logprob = lp[static_cast<std::size_t>(out.token)];
    out.top = top_logprobs(lp, draw.logprobs);
  }
  return out;
}

}  // namespace r3::engine
