#include "ops/embedding.h"

#include <cstring>

namespace r3::ops::cpu {

void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  R3_CHECK(table.rank() == 2 && table.is_contiguous(), "embedding: table must be [vocab, hidden]");
  const int64_t vocab = table.dim(0), hidden = table.dim(1);
  R3_CHECK(out.rank() == 2 && out.dim(0) == static_cast<int64_t>(ids.size()) && out.dim(1) == hidden,
           "embedding: out ", shape_to_string(out.shape()), " for ", ids.size(), " ids of width ", hidden);
  const std::size_t row_bytes = static_cast<std::size_t>(hidden) * dtype_size(table.dtype());
  const auto* base = static_cast<const unsigned char*>(table.raw_data());
  float* o = out.data<float>();
  for (std::size_t t = 0; t < ids.size(); ++t) {
    R3_CHECK(ids[t] >= 0 && ids[t] < vocab, "embedding: token id ", ids[t], " outside [0, ", vocab, ")");
    const unsigned char* row = base + static_cast<std::size_t>(ids[t]) * row_bytes;
    float* dst = o + static_cast<int64_t>(t) * hidden;
    if (table.block_scales() != nullptr) {
      row_to_f32(table, ids[t], dst);
    } else if (table.dtype() == DType::F32) {
      std::memcpy(dst, row, row_bytes);
    } else {
      convert_to_f32(row, table.dtype(), static_cast<std::size_t>(hidden), dst);
    }
  }
}

}  // namespace r3::ops::cpu
