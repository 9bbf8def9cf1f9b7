#include "moe/ep/device_expert_moves.h"

#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "backend/cuda/state.h"
#include "backend/device_memory.h"
#include "core/check.h"
#include "moe/ep/expert_transfer.h"

namespace r3::moe::ep {

namespace {

// Each stacked tensor of the experts ([experts, ...]), the bytes one expert takes in it, and an
// expert's record: those bytes of every tensor one after the other.
struct ExpertRecord {
  std::vector<Tensor*> parts;
  std::vector<int64_t> part_bytes;
  int64_t bytes = 0;
};

ExpertRecord record_of(DeviceExperts& e) {
  ExpertRecord r;
  const int64_t count = e.gate.dim(0);
  const std::array<Tensor*, 9> all = {&e.gate,        &e.up,          &e.down,      &e.gate_scales, &e.up_scales,
                                      &e.down_scales, &e.gate_bias,   &e.up_bias,   &e.down_bias};
  for (Tensor* t : all) {
    if (!t->defined()) continue;
    R3_CHECK(t->is_contiguous() && t->dim(0) == count, "EPLB (cuda): a stacked expert tensor of ",
             shape_to_string(t->shape()), " for ", count, " experts");
    r.parts.push_back(t);
    r.part_bytes.push_back(static_cast<int64_t>(t->nbytes()) / count);
    r.bytes += r.part_bytes.back();
  }
  return r;
}

enum class Direction { kPack, kUnpack };

// Copies slot `slot`'s record between the stacked tensors and the buffer at `at`, on the stream.
void copy_record(const ExpertRecord& r, int32_t index, std::byte* at, Direction direction, cudaStream_t stream) {
  for (std::size_t i = 0; i < r.parts.size(); ++i) {
    auto* in_tensor = static_cast<std::byte*>(r.parts[i]->raw_data()) + index * r.part_bytes[i];
    const auto bytes = static_cast<std::size_t>(r.part_bytes[i]);
    if (direction == Direction::kPack) {
      R3_CUDA_CHECK(cudaMemcpyAsync(at, in_tensor, bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      R3_CUDA_CHECK(cudaMemcpyAsync(in_tensor, at, bytes, cudaMemcpyDeviceToDevice, stream));
    }
    at += r.part_bytes[i];
  }
}

}  // namespace

void move_device_experts(backend::Context& ctx, DeviceExperts& experts, std::span<const ExpertMove> moves,
                         std::span<const int32_t> owner_of, DeviceExchange* exchange) {
  const int me = exchange != nullptr ? exchange->rank() : 0, ranks = exchange != nullptr ? exchange->size() : 1;
  const RankExpertTransfer plan = plan_rank_transfer(moves, owner_of, me, ranks);
  const ExpertRecord record = record_of(experts);
  const int32_t first = experts.first, held = static_cast<int32_t>(experts.gate.dim(0));
  const auto index_of = [&](int32_t slot) {
    R3_CHECK(slot >= first && slot < first + held, "EPLB (cuda): rank ", me, " holds slots ", first, " to ",
             first + held - 1, ", not slot ", slot);
    return slot - first;
  };
  const auto n = static_cast<std::size_t>(ranks);
  std::vector<int64_t> send_at(n), send_bytes(n), recv_at(n), recv_bytes(n);
  int64_t sending = 0, receiving = 0;
  for (std::size_t r = 0; r < n; ++r) {
    send_at[r] = sending;
    send_bytes[r] = static_cast<int64_t>(plan.send[r].size()) * record.bytes;
    sending += send_bytes[r];
    recv_at[r] = receiving;
    recv_bytes[r] = static_cast<int64_t>(plan.receive[r].size()) * record.bytes;
    receiving += recv_bytes[r];
  }
  // Every rank has the same moves: with none, every rank leaves the collective here.
  if (moves.empty()) return;
  const backend::cuda::State& s = ctx.cuda_state();
  R3_CUDA_CHECK(cudaSetDevice(s.device));
  Tensor send = backend::device_empty(ctx, DType::U8, {std::max<int64_t>(sending, 1)});
  auto* send_bytes_at = static_cast<std::byte*>(send.raw_data());
  for (std::size_t d = 0; d < n; ++d) {
    std::byte* at = send_bytes_at + send_at[d];
    for (const ExpertMove& move : plan.send[d]) {
      copy_record(record, index_of(move.source_slot), at, Direction::kPack, s.stream);
      at += record.bytes;
    }
  }
  // One rank alone receives its own run: the staging buffer it packed.
  Tensor recv = exchange != nullptr ? backend::device_empty(ctx, DType::U8, {std::max<int64_t>(receiving, 1)}) : send;
  auto* recv_bytes_at = static_cast<std::byte*>(recv.raw_data());
  if (exchange != nullptr) {
    exchange->all_to_all(ctx, send_bytes_at, send_at, send_bytes, recv_bytes_at, recv_at, recv_bytes);
  }
  for (std::size_t from = 0; from < n; ++from) {
    std::byte* at = recv_bytes_at + recv_at[from];
    for (int32_t slot : plan.receive[from]) {
      copy_record(record, index_of(slot), at, Direction::kUnpack, s.stream);
      at += record.bytes;
    }
  }
  R3_CUDA_CHECK(cudaStreamSynchronize(s.stream));  // the staging buffers are freed on return
}

}  // namespace r3::moe::ep
