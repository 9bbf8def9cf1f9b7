// The interface every model family implements for the engine: one forward step over a batch of
// tokens from several sequences, its cache, its MoE layers (for capture binding and EPLB).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "backend/context.h"
#include "models/forward_batch.h"
#include "models/model_cache.h"
#include "models/model_info.h"
#include "models/parameter_table.h"
#include "moe/eplb/eplb_controller.h"
#include "moe/moe_block.h"
#include "ops/token_draw.h"

namespace r3::models {

class CausalLM {
 public:
  virtual ~CausalLM() = default;

  virtual const ModelInfo& info() const = 0;
  // A cache for `max_seqs` sequences of up to `capacity` tokens.
  virtual std::unique_ptr<ModelCache> make_cache(int64_t max_seqs, int64_t capacity) const = 0;
  // A cache whose blocks the engine hands out (ModelCache::set_block_table): a pool of
  // `pool_blocks` blocks of `block_size` positions. A family whose cache cannot be paged that way
  // returns make_cache's (pool_blocks() == 0 then), and the engine only counts blocks for it.
  virtual std::unique_ptr<ModelCache> make_paged_cache(int64_t max_seqs, int64_t capacity, int64_t pool_blocks,
                                                       int64_t block_size) const {
    (void)pool_blocks;
    (void)block_size;
    return make_cache(max_seqs, capacity);
  }
  // Runs one step and writes logits F32 [rows, vocab] for batch.logit_rows (all rows if empty)
  // into `logits`. Every MoE layer records its routing in batch.capture (moe/capture.h) and
  // counts its tokens in batch.loads. Updates the cache lengths of the sequences in the batch.
  // Step buffers come from ctx's workspace: once a step of this size has run, another one
  // allocates no memory (the engine keeps `logits` and the batch across steps).
  virtual void forward_into(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache,
                            Tensor& logits) const = 0;
  // The same, returning new logits.
  Tensor forward(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache) const;
  // Whether the model draws the next tokens itself (forward_drawn): a device model, whose logits
  // then stay on the device. Otherwise the caller draws from forward_into's logits on the host.
  virtual bool draws_tokens() const { return false; }
  // forward_into, then one draw per logits row (draws[i] for row i, by engine::draw_on_host's
  // rules) into drawn[i], instead of the logits. Only where draws_tokens().
  virtual void forward_drawn(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache,
                             std::span<const ops::TokenDraw> draws, std::span<ops::DrawnToken> drawn) const;
  // The MoE layers in order; index j has layer id j.
  virtual std::vector<moe::MoeBlock*> moe_blocks() = 0;

  // The EPLB options the model was loaded with: its replicas were placed at load; the engine
  // runs load windows and rebalancing from them (moe::EplbController over the step's loads).
  const moe::EplbOptions& eplb_options() const { return eplb_options_; }
  // Checks `options` against this model's MoE layers (topology included) and keeps them.
  void set_eplb_options(const moe::EplbOptions& options);

  // Every weight the model holds, by the checkpoint tensor it was loaded from
  // (models/parameter_table.h); empty for a model made without a checkpoint. A model placed on a
  // device shares its host model's table.
  const ParameterTable& parameters() const { return *parameters_; }
  const std::shared_ptr<const ParameterTable>& shared_parameters() const { return parameters_; }
  void set_parameters(std::shared_ptr<const ParameterTable> table);

 private:
  moe::EplbOptions eplb_options_;
  std::shared_ptr<const ParameterTable> parameters_ = std::make_shared<const ParameterTable>();
};

// Checks a batch against the model and cache: ids in the vocabulary, each sequence's tokens
// continuing its cached prefix, capacity, logit rows, replayed routing size.
// Allocates nothing: its per-sequence bookkeeping comes from `workspace`.
void validate_batch(backend::Workspace& workspace, const ForwardBatch& batch, const ModelCache& cache,
                    const ModelInfo& info);

// Rows of logits a step computes: batch.logit_rows, or every row when that is empty.
int64_t logit_row_count(const ForwardBatch& batch);
// Checks that `logits` is the F32 [logit_row_count(batch), vocab] tensor forward_into writes.
void check_logits_shape(const ForwardBatch& batch, const ModelInfo& info, const Tensor& logits);

}  // namespace r3::models
