// Expert-parallel ranks as threads of one process exchanging device buffers by copies
// (moe/ep/device_exchange.h): on one GPU (ranks sharing it, as the single-GPU machine tests them)
// or several (cudaMemcpyPeerAsync). Each exchange: a rank waits for its stream, tells every rank
// where its bytes for it are (through the host in-process transport, moe/ep/in_process_transport.h,
// which is also the barrier and carries a failure to every rank), copies its incoming runs on its
// own stream, waits for them, and meets the others once more, so that no rank writes its send
// buffer again while another still copies from it. Synchronous: an eager step's tool, not a
// graph's.
#pragma once

#include <memory>
#include <vector>

#include "moe/ep/device_exchange.h"
#include "moe/ep/in_process_transport.h"

namespace r3::moe::ep {

class InProcessDeviceExchangeGroup final : public DeviceExchangeGroup {
 public:
  // contexts[r]: rank r's CUDA context (outliving the group).
  explicit InProcessDeviceExchangeGroup(std::vector<backend::Context*> contexts);
  ~InProcessDeviceExchangeGroup() override;

  DeviceExchange& rank(int r) override;
  void reset() override { host_.reset(); }
  std::string kind() const override { return "in-process copies"; }

 private:
  class Endpoint;
  InProcessGroup host_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace r3::moe::ep
