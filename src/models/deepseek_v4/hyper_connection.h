// Manifold-constrained hyper-connections (mHC) of DeepSeek-V4: the residual is `hc` parallel
// streams per token. Before a sublayer, `pre` weights collapse the streams into its input; after
// it, stream k becomes post[k] * output + sum_j comb[j][k] * stream[j], with `comb` projected to a
// doubly-stochastic matrix by Sinkhorn iterations (ops/sinkhorn).
#pragma once

#include <span>

#include "core/tensor.h"

namespace r3::models {

class HyperConnection {
 public:
  // fn: [(2 + hc) * hc, hc * hidden]; base: [(2 + hc) * hc]; scale: [3].
  HyperConnection(Tensor fn, Tensor base, Tensor scale, int64_t hc, int64_t sinkhorn_iters, float hc_eps,
                  float rms_eps);

  // Floats of scratch mix() needs: the normalised streams and the mixing logits.
  int64_t scratch_size() const { return fn_.dim(1) + fn_.dim(0); }
  // streams: one token's [hc, hidden]; writes pre [hc], post [hc], comb [hc * hc] (comb[j * hc + k]).
  void mix(const float* streams, std::span<float> scratch, float* pre, float* post, float* comb) const;

 private:
  Tensor fn_, base_, scale_;
  int64_t hc_, iters_;
  float hc_eps_, rms_eps_;
};

// The final collapse of the streams before the model's last norm.
class HyperHead {
 public:
  // fn: [hc, hc * hidden]; base: [hc]; scale: [1].
  HyperHead(Tensor fn, Tensor base, Tensor scale, int64_t hc, float hc_eps, float rms_eps);
  // streams: [hc, hidden] -> out: [hidden]; scratch: hc * hidden floats.
  void collapse(const float* streams, int64_t hidden, std::span<float> scratch, float* out) const;

 private:
  Tensor fn_, base_, scale_;
  int64_t hc_;
  float hc_eps_, rms_eps_;
};

// Unweighted RMSNorm of n values into `out` (float accumulation as the reference runs it).
void unweighted_rms_norm(const float* x, int64_t n, float eps, float* out);

}  // namespace r3::models
