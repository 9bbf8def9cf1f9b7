// Expert parallelism on GPUs: the all-to-all over device memory that a MoE layer's dispatch and
// combine run through (moe/device_ep_dispatch.h), the device side of moe/ep/transport.h. Every
// rank of the group calls it for each exchange, in the same order; each rank sends a run of bytes
// to every rank (itself included) and receives one from each, sizes agreed beforehand (a first
// exchange of counts).
//
// Implementations (CUDA builds): ranks as threads of one process, on one GPU or several, copying
// between each other's buffers (moe/ep/cuda/in_process_device_exchange.h), so that the single-GPU
// machine runs the multi-rank logic; and NCCL between GPUs (moe/ep/cuda/nccl_device_exchange.h),
// which the engine takes when every rank has a GPU of its own and the build has NCCL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"

namespace r3::moe::ep {

class DeviceExchange {
 public:
  virtual ~DeviceExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // send, recv: device memory of this rank's context. Rank d gets send[send_offsets[d],
  // + send_bytes[d]); what rank s sends here lands at recv[recv_offsets[s], + recv_bytes[s]),
  // where rank s's send_bytes[me] must equal recv_bytes[s]. In order with ctx's stream: it reads
  // `send` after the work queued before it, and work queued after it sees `recv`. Throws
  // r3::Error on every rank if one of them failed (abort) or the sizes disagree.
  virtual void all_to_all(backend::Context& ctx, const std::byte* send, std::span<const int64_t> send_offsets,
                          std::span<const int64_t> send_bytes, std::byte* recv, std::span<const int64_t> recv_offsets,
                          std::span<const int64_t> recv_bytes) = 0;
  // Marks the group failed (a rank whose own work threw): the other ranks stop waiting for it.
  virtual void abort(const std::string& reason) = 0;
};

// Made by the engine for its GPU ranks (CUDA builds only): one endpoint per rank, over the
// ranks' contexts (rank r's is contexts[r]).
class DeviceExchangeGroup {
 public:
  virtual ~DeviceExchangeGroup() = default;
  virtual DeviceExchange& rank(int r) = 0;
  // After a failure (abort), between steps: the ranks can exchange again.
  virtual void reset() = 0;
  // What carries the bytes, for logs: "NCCL" or "in-process copies".
  virtual std::string kind() const = 0;
};

// The group for GPU ranks whose contexts these are (rank r's is contexts[r], outliving the
// group): NCCL when the build has it and every rank has a GPU of its own, else in-process copies
// (ranks sharing a GPU, as the single-GPU machine runs them). Throws without the CUDA backend.
std::unique_ptr<DeviceExchangeGroup> make_device_exchange_group(const std::vector<backend::Context*>& contexts);

}  // namespace r3::moe::ep
