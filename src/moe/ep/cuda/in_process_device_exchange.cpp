#include "moe/ep/cuda/in_process_device_exchange.h"

#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/state.h"
#include "core/check.h"

namespace r3::moe::ep {

namespace {

// Where a rank's bytes for one other rank are: its device, the address, how many.
struct Posted {
  const std::byte* at;
  int64_t bytes;
  int32_t device;
};

}  // namespace

class InProcessDeviceExchangeGroup::Endpoint final : public DeviceExchange {
 public:
  Endpoint(Transport& host, backend::Context& ctx) : host_(host), ctx_(ctx) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void abort(const std::string& reason) override { host_.abort(reason); }

  void all_to_all(backend::Context& ctx, const std::byte* send, std::span<const int64_t> send_offsets,
                  std::span<const int64_t> send_bytes, std::byte* recv, std::span<const int64_t> recv_offsets,
                  std::span<const int64_t> recv_bytes) override {
    const auto n = static_cast<std::size_t>(size());
    R3_CHECK(&ctx == &ctx_ && send_offsets.size() == n && send_bytes.size() == n && recv_offsets.size() == n &&
                 recv_bytes.size() == n,
             "expert parallelism (device): an exchange on another context or with sizes for other than ",
             n, " ranks");
    const backend::cuda::State& s = ctx.cuda_state();
    R3_CUDA_CHECK(cudaSetDevice(s.device));
    R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));  // `send` is written
    std::vector<Buffer> posts(n);
    for (std::size_t d = 0; d < n; ++d) {
      const Posted p{send + send_offsets[d], send_bytes[d], s.device};
      posts[d].resize(sizeof p);
      std::memcpy(posts[d].data(), &p, sizeof p);
    }
    const std::vector<Buffer> from = host_.all_to_all(std::move(posts));  // every rank has posted
    for (std::size_t r = 0; r < n; ++r) {
      Posted p;
      std::memcpy(&p, from[r].data(), sizeof p);
      if (p.bytes != recv_bytes[r]) {
        const std::string why = "expert parallelism (device): rank " + std::to_string(r) + " sends " +
                                std::to_string(p.bytes) + " bytes to rank " + std::to_string(rank()) + ", which expects " +
                                std::to_string(recv_bytes[r]);
        host_.abort(why);
        R3_FAIL(why);
      }
      if (p.bytes > 0) {
        R3_CUDA_CHECK(cudaMemcpyPeerAsync(recv + recv_offsets[r], s.device, p.at, p.device,
                                          static_cast<std::size_t>(p.bytes), s.stream));
      }
    }
    R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    host_.all_to_all(std::vector<Buffer>(n));  // every rank has copied: the send buffers are free again
  }

 private:
  Transport& host_;
  backend::Context& ctx_;
};

InProcessDeviceExchangeGroup::InProcessDeviceExchangeGroup(std::vector<backend::Context*> contexts)
    : host_(static_cast<int>(contexts.size())) {
  for (std::size_t r = 0; r < contexts.size(); ++r) {
    R3_CHECK(contexts[r] != nullptr && contexts[r]->device() == Device::kCuda,
             "expert parallelism (device): rank ", r, " has no CUDA context");
    endpoints_.push_back(std::make_unique<Endpoint>(host_.rank(static_cast<int>(r)), *contexts[r]));
  }
}

InProcessDeviceExchangeGroup::~InProcessDeviceExchangeGroup() = default;

DeviceExchange& InProcessDeviceExchangeGroup::rank(int r) {
  R3_CHECK(r >= 0 && r < static_cast<int>(endpoints_.size()), "expert parallelism (device): no rank ", r);
  return *endpoints_[static_cast<std::size_t>(r)];
}

}  // namespace r3::moe::ep
