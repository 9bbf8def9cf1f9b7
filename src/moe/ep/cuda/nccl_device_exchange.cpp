#include "moe/ep/cuda/nccl_device_exchange.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <mutex>
#include <set>

#include "backend/cuda/state.h"
#include "core/check.h"

namespace r3::moe::ep {

namespace {

void check_nccl(ncclResult_t status, const char* what) {
  R3_CHECK(status == ncclSuccess, what, ": ", ncclGetErrorString(status));
}

}  // namespace

#define R3_NCCL_CHECK(call) check_nccl((call), #call)

// The group's communicators; abort() on any rank aborts them all, so that ranks waiting on a
// failed one are released (their pending operations end with an error).
struct NcclDeviceExchangeGroup::Comms {
  std::vector<ncclComm_t> comms;
  std::mutex mutex;
  bool aborted = false;
  std::string reason;

  void abort_all(const std::string& why) {
    std::lock_guard lock(mutex);
    if (aborted) return;
    aborted = true;
    reason = why;
    for (ncclComm_t c : comms) ncclCommAbort(c);
  }
  ~Comms() {
    if (!aborted) {
      for (ncclComm_t c : comms) ncclCommDestroy(c);
    }
  }
};

class NcclDeviceExchangeGroup::Endpoint final : public DeviceExchange {
 public:
  // comms: the group's current communicators (reset() replaces them between steps).
  Endpoint(int rank, int size, backend::Context& ctx, const std::shared_ptr<Comms>& comms)
      : rank_(rank), size_(size), ctx_(ctx), comms_(comms) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void abort(const std::string& reason) override { comms_->abort_all(reason); }


  void all_to_all(backend::Context& ctx, const std::byte* send, std::span<const int64_t> send_offsets,
                  std::span<const int64_t> send_bytes, std::byte* recv, std::span<const int64_t> recv_offsets,
                  std::span<const int64_t> recv_bytes) override {
    const auto n = static_cast<std::size_t>(size_);
    R3_CHECK(&ctx == &ctx_ && send_offsets.size() == n && send_bytes.size() == n && recv_offsets.size() == n &&
                 recv_bytes.size() == n,
             "expert parallelism (NCCL): an exchange on another context or with sizes for other than ", n, " ranks");
    {
      std::lock_guard lock(comms_->mutex);
      R3_CHECK(!comms_->aborted, "expert parallelism (NCCL): ", comms_->reason);
    }
    const backend::cuda::State& s = ctx.cuda_state();
    R3_CUDA_CHECK(cudaSetDevice(s.device));
    ncclComm_t comm = comms_->comms[static_cast<std::size_t>(rank_)];
    R3_NCCL_CHECK(ncclGroupStart());
    for (std::size_t r = 0; r < n; ++r) {
      const int peer = static_cast<int>(r);
      if (send_bytes[r] > 0) {
        R3_NCCL_CHECK(ncclSend(send + send_offsets[r], static_cast<std::size_t>(send_bytes[r]), ncclUint8, peer, comm,
                               s.stream));
      }
      if (recv_bytes[r] > 0) {
        R3_NCCL_CHECK(ncclRecv(recv + recv_offsets[r], static_cast<std::size_t>(recv_bytes[r]), ncclUint8, peer, comm,
                               s.stream));
      }
    }
    R3_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  int rank_, size_;
  backend::Context& ctx_;
  const std::shared_ptr<Comms>& comms_;
};

NcclDeviceExchangeGroup::NcclDeviceExchangeGroup(std::vector<backend::Context*> contexts)
    : contexts_(std::move(contexts)) {
  std::set<int> devices;
  for (const backend::Context* c : contexts_) {
    R3_CHECK(c != nullptr && c->device() == Device::kCuda, "expert parallelism (NCCL): a rank without a CUDA context");
    R3_CHECK(devices.insert(c->cuda_state().device).second, "expert parallelism (NCCL): two ranks on GPU ",
             c->cuda_state().device, " (NCCL takes one rank a GPU)");
  }
  reset();
  const int n = static_cast<int>(contexts_.size());
  for (int r = 0; r < n; ++r) {
    endpoints_.push_back(std::make_unique<Endpoint>(r, n, *contexts_[static_cast<std::size_t>(r)], comms_));
  }
}

NcclDeviceExchangeGroup::~NcclDeviceExchangeGroup() = default;

void NcclDeviceExchangeGroup::reset() {
  auto comms = std::make_shared<Comms>();
  comms->comms.resize(contexts_.size());
  std::vector<int> devices;
  for (const backend::Context* c : contexts_) devices.push_back(c->cuda_state().device);
  R3_NCCL_CHECK(ncclCommInitAll(comms->comms.data(), static_cast<int>(devices.size()), devices.data()));
  comms_ = std::move(comms);
}

DeviceExchange& NcclDeviceExchangeGroup::rank(int r) {
  R3_CHECK(r >= 0 && r < static_cast<int>(endpoints_.size()), "expert parallelism (NCCL): no rank ", r);
  return *endpoints_[static_cast<std::size_t>(r)];
}

bool nccl_built() { return true; }

}  // namespace r3::moe::ep
