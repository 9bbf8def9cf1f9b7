#include "ops/kv_write.h"

#include <cstring>

#include "ops/cpu/step_blocks.h"

namespace r3::ops::cpu {

void write_kv(const float* keys, int64_t key_stride, const float* values, int64_t value_stride,
              std::span<const KvWrite> writes) {
  for (std::size_t t = 0; t < writes.size(); ++t) {
    const KvWrite& w = writes[t];
    if (w.kv.keys == nullptr) continue;
    R3_CHECK(w.position >= 0 && w.position / w.kv.block_size < static_cast<int64_t>(w.kv.block_table.size()),
             "write_kv: position ", w.position, " is outside the sequence's ", w.kv.block_table.size(), " blocks");
    const auto i = static_cast<int64_t>(t);
    std::memcpy(w.kv.key_row(w.position), keys + i * key_stride, sizeof(float) * static_cast<std::size_t>(w.kv.key_width));
    std::memcpy(w.kv.value_row(w.position), values + i * value_stride,
                sizeof(float) * static_cast<std::size_t>(w.kv.value_width));
  }
}

void write_kv_paged(backend::Context& ctx, const float* keys, int64_t key_stride, const float* values,
                    int64_t value_stride, const StepView& step, const KvPool& pool) {
  backend::Workspace::Scope scope(ctx.workspace());
  const std::span<KvWrite> writes = step_writes(ctx.workspace(), step, pool, "write_kv_paged");
  write_kv(keys, key_stride, values, value_stride, writes);
}

}  // namespace r3::ops::cpu
