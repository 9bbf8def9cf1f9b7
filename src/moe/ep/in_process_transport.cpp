#include "moe/ep/in_process_transport.h"

#include "core/check.h"

namespace r3::moe::ep {

class InProcessGroup::Endpoint final : public Transport {
 public:
  Endpoint(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }

  std::vector<Buffer> all_to_all(std::vector<Buffer> to_each) override {
    if (static_cast<int>(to_each.size()) != group_.size_) {
      const std::string reason = "all_to_all: rank " + std::to_string(rank_) + " sent " +
                                 std::to_string(to_each.size()) + " buffers to a group of " +
                                 std::to_string(group_.size_);
      group_.fail(reason);
      R3_FAIL(reason);
    }
    for (int d = 0; d < group_.size_; ++d) group_.mailbox_[rank_][d] = std::move(to_each[d]);
    group_.arrive_and_wait();  // every rank has posted
    std::vector<Buffer> received(static_cast<std::size_t>(group_.size_));
    for (int s = 0; s < group_.size_; ++s) received[s] = std::move(group_.mailbox_[s][rank_]);
    group_.arrive_and_wait();  // every rank has collected: the mailboxes may be posted to again
    return received;
  }

  void abort(const std::string& reason) override { group_.fail("rank " + std::to_string(rank_) + ": " + reason); }

 private:
  InProcessGroup& group_;
  int rank_;
};

InProcessGroup::InProcessGroup(int size)
    : size_(size), mailbox_(static_cast<std::size_t>(size), std::vector<Buffer>(static_cast<std::size_t>(size))) {
  R3_CHECK(size >= 1, "expert parallelism: a group of ", size, " ranks");
  for (int r = 0; r < size; ++r) endpoints_.push_back(std::make_unique<Endpoint>(*this, r));
}

InProcessGroup::~InProcessGroup() = default;

Transport& InProcessGroup::rank(int r) {
  R3_CHECK(r >= 0 && r < size_, "expert parallelism: rank ", r, " of a group of ", size_);
  return *endpoints_[static_cast<std::size_t>(r)];
}

void InProcessGroup::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  R3_CHECK(failure_.empty(), "expert-parallel group failed: ", failure_);
  const long generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  changed_.wait(lock, [&] { return generation_ != generation || !failure_.empty(); });
  R3_CHECK(generation_ != generation, "expert-parallel group failed: ", failure_);
}

void InProcessGroup::reset() {
  std::lock_guard lock(mutex_);
  failure_.clear();
  arrived_ = 0;
  ++generation_;
  for (auto& row : mailbox_) {
    for (Buffer& b : row) b.clear();
  }
}

void InProcessGroup::fail(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = reason;
  }
  changed_.notify_all();
}

}  // namespace r3::moe::ep
