// Next-token draws on the GPU from a step's logits while they are still in device memory
// (ops/cuda/sm90_draw_tokens.cu): one block per row finds the row's first non-finite logit, the
// greedy token, the sampled one by engine::choose_token's rule (top-k, top-p, min-p, then the walk
// in id order), and the log-probabilities asked for. Only those few bytes per row reach the host,
// not the [rows, vocab] float32 logits (155 MB at 256 rows of Qwen3's vocabulary).
//
// A step of at most 16 rows drawn without top-k, top-p, min-p or top-n logprobs (an RL rollout's
// draws at batch 1) runs the same arithmetic spread over the GPU in three kernels, with the same
// bits: one block per row would leave all but a few SMs idle while each works through its row's
// 150k double exps.
//
// Determinism: every sum is taken in an order fixed by the block's shape (per-warp segments, then
// the warps in order) and the top-k / top-p boundaries come from histograms of integers (counts,
// and weights in fixed point), so the same logits and draws give the same tokens on every run.
// Against the host's sequential double sums the only possible difference is a draw that lands
// within rounding (~1e-15 relative) of a boundary between two tokens.
#pragma once

#include <cstdint>
#include <span>

#include "backend/context.h"
#include "core/tensor.h"
#include "ops/token_draw.h"

namespace r3::ops::cuda {

class TokenDrawer {
 public:
  // spread_few_rows = false: every step takes the one-block-per-row kernel (tests compare the two).
  explicit TokenDrawer(bool spread_few_rows = true) : spread_few_rows_(spread_few_rows) {}
  ~TokenDrawer();
  TokenDrawer(const TokenDrawer&) = delete;
  TokenDrawer& operator=(const TokenDrawer&) = delete;

  // draws[i] from row i of `logits` (F32 [rows, vocab] on ctx's device, rows == draws.size())
  // into drawn[i]; waits for the stream (the step's one wait). Buffers grow on the first call of
  // a larger step, never inside a graph.
  void draw(backend::Context& ctx, const Tensor& logits, std::span<const TokenDraw> draws,
            std::span<DrawnToken> drawn);
  // How many steps were drawn spread over the GPU.
  int64_t spread_steps() const { return spread_steps_; }

 private:
  void reserve(backend::Context& ctx, int64_t rows, int64_t top);

  bool spread_few_rows_ = true;
  int64_t rows_ = 0, top_ = 0;         // capacity: rows, and top logprobs per row
  void* host_ = nullptr;               // pinned: the draws, then the results
  void* device_ = nullptr;             // the same layout on the device
  int64_t spread_bytes_ = 0;           // capacity of spread_scratch_
  void* spread_scratch_ = nullptr;     // the spread draws' stored weights (device)
  int64_t spread_steps_ = 0;
};

}  // namespace r3::ops::cuda
