// Expert parallelism's dispatch and combine on the device, the GPU form of
// ExpertParallelDispatcher (moe/ep/expert_parallel_dispatcher.h), with the bytes carried by a
// moe/ep/device_exchange.h. A layer's pairs are planned for the ranks holding their physical
// experts (each pair's slot among the pairs for its rank, in pair order, so the layout depends on
// nothing but the routing), packed into one send buffer by rank, exchanged (the counts first),
// run through the experts where they land (moe::rows_through_their_experts_on_device), sent back
// in the same slots and combined in choice order with the one-rank arithmetic, so that every
// token's output has its one-rank bits whatever the group.
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::moe {

// The most ranks the device dispatch plans for.
constexpr int kMaxDeviceEpRanks = 64;

#if R3_WITH_CUDA
// ids: device [pairs] physical ids; owner_of: device [num_physical] ranks in [0, ranks). Writes
// (device int32) counts [ranks] (pairs for each rank), offsets [ranks] (their exclusive prefix:
// where each rank's pairs start in the send buffer) and pair_slot [pairs] (a pair's place among
// its rank's, in pair order).
void plan_expert_parallel_slots(backend::Context& ctx, const int32_t* ids, int64_t pairs, const int32_t* owner_of,
                                int ranks, int32_t* counts, int32_t* offsets, int32_t* pair_slot);

// Pair p = t * k + c's hidden row (hidden [tokens, H], device) and physical id to row
// offsets[rank of p] + pair_slot[p] of send_rows [tokens * k, H] / send_ids [tokens * k].
void pack_expert_parallel_rows(backend::Context& ctx, const Tensor& hidden, int64_t k, const int32_t* ids,
                               const int32_t* owner_of, const int32_t* offsets, const int32_t* pair_slot,
                               Tensor& send_rows, int32_t* send_ids);

// out [tokens, H] = for each token, the sum over its choices in order of weights[p] x the row
// its pair came back in (back_rows [tokens * k, H], in the send buffer's layout), each product
// rounded, then added: the combine of every MoE path.
void combine_expert_parallel_rows(backend::Context& ctx, const Tensor& back_rows, const int32_t* ids,
                                  const float* weights, int64_t k, const int32_t* owner_of, const int32_t* offsets,
                                  const int32_t* pair_slot, Tensor& out);
#endif

}  // namespace r3::moe
