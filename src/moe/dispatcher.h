// The dispatch and combine stages of the MoE pipeline, between the EPLB map and the combine:
//
//   physical routing -> DISPATCH (pairs grouped by physical expert, hidden rows gathered)
//                    -> experts (one GEMM pair per group, over stacked weights: ExpertBank)
//                    -> COMBINE (each token's k outputs, weighted, summed in choice order)
//
// Dispatcher is the interface an expert-parallel all-to-all will implement (rows travel to the
// rank holding their expert and back); LocalDispatcher keeps everything on this device. Both
// experts kernels (moe/expert_kernels.h) go through it, so they differ only in how they run the
// GEMMs.
#pragma once

#include <cstdint>
#include <span>

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/physical_experts.h"

namespace r3::moe {

// One step's pairs (token, choice) grouped by physical expert. Lives in the step workspace.
// Locally every pair of the step is here; under expert parallelism (moe/ep) the rows are the pairs
// any rank sent to this rank's experts, and source_rank / source_pair say where each came from.
struct Dispatch {
  std::span<const int64_t> group_start;  // [num_physical + 1]: expert e's rows are [start[e], start[e + 1])
  std::span<const int64_t> row_of_pair;  // [tokens * top_k]: where pair t * top_k + k was put (local only)
  Tensor rows;                           // F32 [rows, hidden]: the pairs' hidden rows, grouped
  std::span<const int32_t> source_rank;  // [rows] (expert parallelism only)
  std::span<const int64_t> source_pair;  // [rows]: the pair's index t * top_k + k on its rank

  int64_t group_rows(int32_t e) const { return group_start[static_cast<std::size_t>(e) + 1] - group_start[static_cast<std::size_t>(e)]; }
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  // Groups the routing's pairs by physical expert (each group in (token, choice) order) and
  // gathers their rows of `hidden` [tokens, hidden].
  virtual Dispatch dispatch(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                            int64_t num_physical) const = 0;
  // out[t] = sum over choices k, in order, of weight[t, k] * expert_out[row_of_pair[t * K + k]].
  virtual void combine(backend::Context& ctx, const Dispatch& dispatch, const Tensor& expert_out,
                       const PhysicalRouting& routing, Tensor& out) const = 0;
};

class LocalDispatcher final : public Dispatcher {
 public:
  Dispatch dispatch(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                    int64_t num_physical) const override;
  void combine(backend::Context& ctx, const Dispatch& dispatch, const Tensor& expert_out,
               const PhysicalRouting& routing, Tensor& out) const override;
};

// The dispatcher of a single-device engine.
const Dispatcher& local_dispatcher();

// out [tokens, hidden] = for each token, the sum over its choices k, in order, of weight[t, k] *
// pair_rows[row_of_pair[t * K + k]] (row_of_pair empty: row t * K + k). The one combine every
// dispatcher ends with, so that a token's output has the same bits however its pairs travelled.
void combine_in_choice_order(const PhysicalRouting& routing, const float* pair_rows,
                             std::span<const int64_t> row_of_pair, Tensor& out);

}  // namespace r3::moe
