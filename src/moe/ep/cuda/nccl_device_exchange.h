// Expert-parallel ranks on GPUs of their own exchanging device buffers through NCCL
// (moe/ep/device_exchange.h): one communicator per rank from ncclCommInitAll over the ranks'
// devices (one process, a thread per rank), each exchange a group of ncclSend / ncclRecv on the
// rank's stream, so that it stays in the stream's order and needs no host wait of its own. Built
// when NCCL is found (R3_WITH_NCCL).
#pragma once

#include <memory>
#include <vector>

#include "moe/ep/device_exchange.h"

namespace r3::moe::ep {

class NcclDeviceExchangeGroup final : public DeviceExchangeGroup {
 public:
  // contexts[r]: rank r's CUDA context (outliving the group); their devices must all differ.
  explicit NcclDeviceExchangeGroup(std::vector<backend::Context*> contexts);
  ~NcclDeviceExchangeGroup() override;

  DeviceExchange& rank(int r) override;
  // Aborted communicators cannot be used again: reset makes new ones.
  void reset() override;
  std::string kind() const override { return "NCCL"; }

 private:
  class Endpoint;
  struct Comms;
  std::vector<backend::Context*> contexts_;
  std::shared_ptr<Comms> comms_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

// Whether this build has NCCL.
bool nccl_built();

}  // namespace r3::moe::ep
