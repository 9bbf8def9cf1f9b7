// EPLB on the GPU: after a rebalance, a layer's device experts (moe/device_experts.h; a rank's
// slice of them, or all) take the new placement by moving only the slots whose logical expert
// changed, device to device. Each slot takes the weights of a slot that held its new expert
// before (moe/ep/expert_moves.h chooses it, preferring one on the same rank); across ranks they
// travel in one all-to-all over the device exchange (NCCL between GPUs, in-process copies between
// ranks sharing one), in the order moe/ep/expert_transfer.h agrees. Nothing comes from the host,
// and no second copy of the layer is made: only the moved experts are staged, once to send and
// once as received.
#pragma once

#include <cstdint>
#include <span>

#include "backend/context.h"
#include "moe/device_experts.h"
#include "moe/ep/device_exchange.h"
#include "moe/ep/expert_moves.h"

namespace r3::moe::ep {

#if R3_WITH_CUDA
// A collective: every rank of `exchange` calls it with the same moves and owners (owner_of[slot]:
// the rank holding each physical slot, which must agree with each rank's slice, experts.first
// on). Without an exchange (one rank holding every slot) the moves run through a staging buffer
// of the rank's own. The device addresses of `experts` stay, so recorded CUDA graphs stay valid.
// Waits for the copies. Throws if a move names a slot outside the slices or the ranks' sizes
// disagree.
void move_device_experts(backend::Context& ctx, DeviceExperts& experts, std::span<const ExpertMove> moves,
                         std::span<const int32_t> owner_of, DeviceExchange* exchange);
#endif

}  // namespace r3::moe::ep
