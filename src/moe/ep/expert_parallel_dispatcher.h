// Dispatch and combine across the ranks of an expert-parallel group (moe/dispatcher.h over
// moe/ep/transport.h). Each physical expert lives on one rank (owner_of[physical]); a rank routes
// its own tokens (the capture of their logical ids has already happened, on this rank, before the
// EPLB map). dispatch sends every (token, choice) pair's hidden row to its expert's rank, which
// groups what it receives by expert (in source-rank order, then each rank's pair order); the
// experts kernels run there over those groups only; combine sends each output row back to the
// rank its token came from, which sums a token's k outputs in choice order with the same
// arithmetic as on one rank (combine_in_choice_order). An expert's output for a pair does not
// depend on the other pairs it shares a group with, so every token's output has the bits it has
// on one rank, whatever the group's size.
//
// Both calls are collectives: every rank of the group calls dispatch and then combine for each
// MoE layer of each step, in the same order, a rank without tokens included.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/device_experts.h"
#include "moe/dispatcher.h"
#include "moe/ep/device_exchange.h"
#include "moe/ep/transport.h"

namespace r3::moe::ep {

class ExpertParallelDispatcher final : public Dispatcher {
 public:
  // owner_of: [num_physical] ranks in [0, transport.size()). device: on GPU ranks, the exchange
  // over device memory that the device MoE layer dispatches through instead
  // (moe/device_ep_dispatch.h), with the same owners; null on the CPU.
  ExpertParallelDispatcher(Transport& transport, std::vector<int32_t> owner_of, DeviceExchange* device = nullptr);

  Dispatch dispatch(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                    int64_t num_physical) const override;
  void combine(backend::Context& ctx, const Dispatch& dispatch, const Tensor& expert_out,
               const PhysicalRouting& routing, Tensor& out) const override;

  // (token, choice) rows dispatched to another rank's experts so far: the all-to-all's traffic.
  int64_t rows_sent_elsewhere() const { return rows_sent_elsewhere_; }
  // The device MoE layer's counterpart (it counts its own rows into count_rows_sent_elsewhere).
  DeviceExchange* device_exchange() const { return device_; }
  const std::vector<int32_t>& owner_of() const { return owner_of_; }
  void count_rows_sent_elsewhere(int64_t rows) const { rows_sent_elsewhere_ += rows; }

 private:
  Transport& transport_;
  std::vector<int32_t> owner_of_;
  DeviceExchange* device_;
  mutable int64_t rows_sent_elsewhere_ = 0;  // one rank's thread dispatches through it
};

// The physical experts in contiguous slices over `ranks` ranks, as evenly as they divide: expert
// p on rank p * ranks / num_physical.
std::vector<int32_t> contiguous_owners(int64_t num_physical, int ranks);
// Rank `rank`'s physical experts under contiguous_owners: the slice a GPU rank places.
ExpertSlice contiguous_slice(int64_t num_physical, int ranks, int rank);

}  // namespace r3::moe::ep
