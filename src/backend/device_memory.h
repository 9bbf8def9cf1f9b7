// Tensors on a context's device: allocation, and copies between the host and the device. On a
// CPU context these are host tensors and the copies are the tensors themselves.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::backend {

// A zero-filled tensor on ctx's device, freed with its last copy.
Tensor device_empty(Context& ctx, DType dtype, Shape shape);
// A zero-filled host tensor that copies from ctx's device reach at full speed: page-locked on a
// CUDA context (several times faster to copy into than ordinary memory, slow to allocate: keep
// it across steps), ordinary memory on the CPU.
Tensor host_staging_empty(Context& ctx, DType dtype, Shape shape);
// A contiguous host tensor on ctx's device (a copy on CUDA; `host` itself on the CPU).
Tensor to_device(Context& ctx, const Tensor& host);
// The same as F32 or BF16: widened exactly, or rounded to the nearest bfloat16 (ties to even).
Tensor to_device_as(Context& ctx, const Tensor& host, DType dtype);
// Writes the contiguous host tensor `src` as numel() values of `dtype` (F32 or BF16) at `dst`.
void convert_matrix(const Tensor& src, DType dtype, void* dst);
// A tensor of ctx's device on the host (waits for the context's work to finish).
Tensor to_host(Context& ctx, const Tensor& t);
// Copies device (or host) tensor `t` into the host tensor `host` of the same dtype and size, and
// waits for it.
void copy_to_host(Context& ctx, const Tensor& t, Tensor& host);
// Copies `src` into `dst`, tensors of ctx's device of the same dtype and size (on the CPU, a
// memcpy); waits for it.
void copy_on_device(Context& ctx, const Tensor& src, Tensor& dst);
// The device's copy bandwidth in bytes/s: 2 x bytes / time of device-to-device copies of 2 GiB
// (read + write), the yardstick of the GPU benchmarks. Throws on a CPU context.
double measure_copy_bandwidth(Context& ctx);
// Bytes of ctx's device memory free now (throws on a CPU context).
int64_t device_memory_free(Context& ctx);
// Sets a contiguous tensor of ctx's device to zeros: on CUDA queued on the context's stream, in
// order with its kernels (no wait); on the CPU at once.
void fill_zero(Context& ctx, Tensor& t);
// Waits for every kernel and copy queued on ctx (a no-op on the CPU).
void synchronize(Context& ctx);

}  // namespace r3::backend
