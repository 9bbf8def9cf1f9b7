// How an op reaches its implementation for the context's device (in the manner of CTranslate2's
// device dispatch): an op's header declares ops::cpu::name (ops/cpu/name.cpp) and defines the op
// as R3_DISPATCH(ctx, name, args...). The CUDA backend adds its case here (ops::cuda::name in
// ops/cuda/sm90_name.cu), so no model or layer ever names a device.
#pragma once

#include "backend/context.h"
#include "core/check.h"

namespace r3::backend {

[[noreturn]] inline void unsupported_device(Device device, const char* op) {
  throw Error(detail::concat("op '", op, "' has no implementation for device ", device_name(device),
                             " in this build"));
}

}  // namespace r3::backend

#define R3_DISPATCH(ctx, name, ...)                                              \
  do {                                                                           \
    switch ((ctx).device()) {                                                    \
      case ::r3::Device::kCpu:                                                   \
        return cpu::name(__VA_ARGS__);                                           \
      default:                                                                   \
        ::r3::backend::unsupported_device((ctx).device(), #name);                \
    }                                                                            \
  } while (false)
