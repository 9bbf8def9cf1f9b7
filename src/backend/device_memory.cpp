#include "backend/device_memory.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace r3::backend {

#if R3_WITH_CUDA
namespace cuda {
Tensor empty(Context& ctx, DType dtype, Shape shape);
Tensor upload(Context& ctx, const Tensor& host);
Tensor pinned_host(Context& ctx, DType dtype, Shape shape);
Tensor download(Context& ctx, const Tensor& t);
void download_into(Context& ctx, const Tensor& t, Tensor& host);
void copy_device_to_device(Context& ctx, const Tensor& src, Tensor& dst);
double copy_bandwidth(Context& ctx);
int64_t free_bytes(Context& ctx);
void synchronize(Context& ctx);
void zero(Context& ctx, Tensor& t);
}  // namespace cuda
#endif

Tensor device_empty(Context& ctx, DType dtype, Shape shape) {
#if R3_WITH_CUDA
  if (ctx.device() == Device::kCuda) return cuda::empty(ctx, dtype, std::move(shape));
#endif
  (void)ctx;
  return Tensor::empty(dtype, std::move(shape));
}

Tensor host_staging_empty(Context& ctx, DType dtype, Shape shape) {
#if R3_WITH_CUDA
  if (ctx.device() == Device::kCuda) return cuda::pinned_host(ctx, dtype, std::move(shape));
#endif
  (void)ctx;
  return Tensor::empty(dtype, std::move(shape));
}

Tensor to_device(Context& ctx, const Tensor& host) {
  R3_CHECK(host.device() == Device::kCpu && host.is_contiguous(), "to_device: needs a contiguous host tensor");
#if R3_WITH_CUDA
  if (ctx.device() == Device::kCuda) {
    // A quantized weight goes up as it is stored, its scales beside it.
    const Tensor values = cuda::upload(ctx, host);
    if (const BlockScales* s = host.block_scales()) {
      BlockScales scales = *s;
      scales.scales = cuda::upload(ctx, s->scales);
      return values.with_block_scales(std::move(scales));
    }
    if (const MxScales* s = host.mx_scales()) {
      R3_CHECK(s->scales.is_contiguous(), "to_device: an MXFP4 matrix whose scale rows lie apart");
      return values.with_mx_scales(cuda::upload(ctx, s->scales));
    }
    return values;
  }
#endif
  (void)ctx;
  return host;
}

void convert_matrix(const Tensor& src, DType dtype, void* dst) {
  R3_CHECK(src.device() == Device::kCpu && src.is_contiguous(), "convert: needs a contiguous host tensor");
  R3_CHECK(dtype == DType::F32 || dtype == DType::BF16, "convert: to F32 or BF16, not ", dtype_name(dtype));
  R3_CHECK(src.block_scales() == nullptr && src.dtype() != DType::F4_E2M1X2,
           "convert: quantized ", dtype_name(src.dtype()), " weights are not widened (the device reads them as stored)");
  const auto n = static_cast<std::size_t>(src.numel());
  if (src.dtype() == dtype) {
    std::memcpy(dst, src.raw_data(), src.nbytes());
  } else if (dtype == DType::F32) {
    convert_to_f32(src.raw_data(), src.dtype(), n, static_cast<float*>(dst));
  } else {
    // Through a float32 buffer of bounded size: a large matrix (lm_head) needs no widened copy.
    constexpr std::size_t kBlock = std::size_t{1} << 16;
    std::vector<float> wide(std::min(n, kBlock));
    const auto* in = static_cast<const unsigned char*>(src.raw_data());
    auto* out = static_cast<uint16_t*>(dst);
    for (std::size_t first = 0; first < n; first += kBlock) {
      const std::size_t count = std::min(kBlock, n - first);
      convert_to_f32(in + first * dtype_size(src.dtype()), src.dtype(), count, wide.data());
      for (std::size_t i = 0; i < count; ++i) out[first + i] = f32_to_bf16(wide[i]);
    }
  }
}

Tensor to_device_as(Context& ctx, const Tensor& host, DType dtype) {
  // Quantized weights keep their format: the kernels decode them (never a widened copy).
  const bool quantized = host.block_scales() != nullptr || host.mx_scales() != nullptr;
  if (host.dtype() == dtype || quantized) return to_device(ctx, host);
  Tensor converted = Tensor::empty(dtype, host.shape());
  convert_matrix(host, dtype, converted.raw_data());
  return to_device(ctx, converted);
}

Tensor to_host(Context& ctx, const Tensor& t) {
#if R3_WITH_CUDA
  if (t.device() == Device::kCuda) return cuda::download(ctx, t);
#endif
  (void)ctx;
  return t;
}

void copy_to_host(Context& ctx, const Tensor& t, Tensor& host) {
  R3_CHECK(host.device() == Device::kCpu && t.dtype() == host.dtype() && t.numel() == host.numel() &&
               t.is_contiguous() && host.is_contiguous(),
           "copy_to_host: ", dtype_name(t.dtype()), " ", shape_to_string(t.shape()), " into ", dtype_name(host.dtype()),
           " ", shape_to_string(host.shape()));
#if R3_WITH_CUDA
  if (t.device() == Device::kCuda) return cuda::download_into(ctx, t, host);
#endif
  (void)ctx;
  if (t.raw_data() != host.raw_data()) std::memcpy(host.raw_data(), t.raw_data(), t.nbytes());
}

void copy_on_device(Context& ctx, const Tensor& src, Tensor& dst) {
  R3_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel() && src.is_contiguous() && dst.is_contiguous() &&
               src.device() == dst.device(),
           "copy_on_device: ", dtype_name(src.dtype()), " ", shape_to_string(src.shape()), " into ",
           dtype_name(dst.dtype()), " ", shape_to_string(dst.shape()));
#if R3_WITH_CUDA
  if (src.device() == Device::kCuda) return cuda::copy_device_to_device(ctx, src, dst);
#endif
  (void)ctx;
  if (src.raw_data() != dst.raw_data()) std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
}

double measure_copy_bandwidth(Context& ctx) {
#if R3_WITH_CUDA
  if (ctx.device() == Device::kCuda) return cuda::copy_bandwidth(ctx);
#endif
  (void)ctx;
  R3_FAIL("copy bandwidth: needs a CUDA context");
}

int64_t device_memory_free(Context& ctx) {
#if R3_WITH_CUDA
  if (ctx.device() == Device::kCuda) return cuda::free_bytes(ctx);
#endif
  (void)ctx;
  R3_FAIL("free device memory: needs a CUDA context");
}

void synchronize(Context& ctx) {
#if R3_WITH_CUDA
  if (ctx.device() == Device::kCuda) cuda::synchronize(ctx);
#endif
  (void)ctx;
}

void fill_zero(Context& ctx, Tensor& t) {
  R3_CHECK(t.is_contiguous(), "fill_zero: needs a contiguous tensor");
#if R3_WITH_CUDA
  if (t.device() == Device::kCuda) {
    R3_CHECK(ctx.device() == Device::kCuda, "fill_zero: a device tensor on a CPU context");
    return cuda::zero(ctx, t);
  }
#endif
  (void)ctx;
  std::memset(t.raw_data(), 0, t.nbytes());
}

}  // namespace r3::backend
