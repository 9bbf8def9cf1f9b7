// How an op reaches its implementation for the context's device (in the manner of CTranslate2's
// device dispatch): an op's header declares ops::cpu::name (ops/cpu/name.cpp) and defines the op
// as R3_DISPATCH(ctx, name, args...). An op that also has a CUDA implementation (ops::cuda::name
// in ops/cuda/sm90_name.cu, declared under R3_WITH_CUDA) uses R3_DISPATCH_GPU instead, so no
// model or layer ever names a device; ops without one refuse a CUDA context by name.
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

#if R3_WITH_CUDA
#define R3_DISPATCH_GPU(ctx, name, ...)                                          \
  do {                                                                           \
    switch ((ctx).device()) {                                                    \
      case ::r3::Device::kCpu:                                                   \
        return cpu::name(__VA_ARGS__);                                           \
      case ::r3::Device::kCuda:                                                  \
        return cuda::name(__VA_ARGS__);                                          \
    }                                                                            \
    ::r3::backend::unsupported_device((ctx).device(), #name);                    \
  } while (false)
#else
#define R3_DISPATCH_GPU(ctx, name, ...) R3_DISPATCH(ctx, name, __VA_ARGS__)
#endif
