// Expert-parallel ranks as threads of one process (moe/ep/transport.h): `--ep N` on the CPU runs N
// such ranks, so the multi-rank logic runs in CI without GPUs. The group owns a mailbox for every
// (source, destination) pair; an exchange is two rounds of a barrier: all ranks post, then all
// ranks collect (the second round keeps a fast rank's next post from overwriting a mailbox a slow
// rank has not read yet). Moves buffers, never copies them.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "moe/ep/transport.h"

namespace r3::moe::ep {

class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  ~InProcessGroup();  // where Endpoint is complete
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const { return size_; }
  // Rank r's endpoint (0 <= r < size), owned by the group; each rank's thread uses its own.
  Transport& rank(int r);
  // Clears a failure (abort) so that the ranks can exchange again; only while no rank is inside
  // all_to_all (between steps).
  void reset();

 private:
  class Endpoint;
  // Blocks until all size_ ranks have arrived at this round; throws if the group was aborted.
  void arrive_and_wait();
  void fail(const std::string& reason);

  int size_;
  std::vector<std::vector<Buffer>> mailbox_;  // [source][destination]
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  long generation_ = 0;
  std::string failure_;  // non-empty once aborted
};

}  // namespace r3::moe::ep
