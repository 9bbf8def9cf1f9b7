// Where a tensor's memory lives and where kernels run. The CPU is the exact oracle; CUDA
// (sm_90a) is the serving device.
#pragma once

namespace r3 {

enum class Device { kCpu, kCuda };

inline const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

}  // namespace r3
