#include "moe/ep/device_exchange.h"

#include <set>

#include "core/check.h"
#if R3_WITH_CUDA
#include "backend/cuda/state.h"
#include "moe/ep/cuda/in_process_device_exchange.h"
#endif
#if R3_WITH_NCCL
#include "moe/ep/cuda/nccl_device_exchange.h"
#endif

namespace r3::moe::ep {

std::unique_ptr<DeviceExchangeGroup> make_device_exchange_group(const std::vector<backend::Context*>& contexts) {
#if R3_WITH_CUDA
  std::set<int> devices;
  for (const backend::Context* c : contexts) devices.insert(c->cuda_state().device);
  const bool gpu_each = devices.size() == contexts.size();
#if R3_WITH_NCCL
  if (gpu_each && contexts.size() > 1) return std::make_unique<NcclDeviceExchangeGroup>(contexts);
#endif
  (void)gpu_each;
  return std::make_unique<InProcessDeviceExchangeGroup>(contexts);
#else
  (void)contexts;
  R3_FAIL("expert parallelism across GPUs: this build has no CUDA backend");
#endif
}

}  // namespace r3::moe::ep
