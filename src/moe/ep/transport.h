// How the ranks of an expert-parallel group exchange data: the one collective expert parallelism
// needs, an all-to-all of byte buffers (each rank sends one buffer to every rank, itself included,
// and receives one from each). Dispatch sends each token's hidden row to the ranks holding its
// experts and combine sends the experts' outputs back (moe/dispatcher.h); the rebalancer moves
// expert weights the same way. One Transport is one rank's endpoint.
//
// Implementations: InProcessGroup (moe/ep/in_process_transport.h), N ranks as threads of one
// process, so that dispatch, combine, placement and capture are tested on the CPU; NCCL between
// GPUs comes with the CUDA side of expert parallelism.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace r3::moe::ep {

using Buffer = std::vector<std::byte>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank of the group calls it, with size() buffers: to_each[d] goes to rank d. Returns
  // size() buffers: [s] is what rank s sent to this one. Blocks until every rank has called it;
  // throws r3::Error on every rank if one of them failed (abort) or called it with the wrong
  // number of buffers, rather than leaving the others waiting.
  virtual std::vector<Buffer> all_to_all(std::vector<Buffer> to_each) = 0;
  // Marks the group failed: every rank waiting in all_to_all, or calling it later, throws with
  // `reason`. For a rank whose own work threw, so that the others do not wait for it forever.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace r3::moe::ep
