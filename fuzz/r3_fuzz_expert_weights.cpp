// libFuzzer target: a message of expert weights as one expert-parallel rank sends another when EPLB
// moves experts (moe/ep/expert_weights_wire.h). Any bytes must end in an r3::Error or in experts
// whose tensors hold what they say: matrices of gate, up and down, and attached scales that cover
// them (Tensor::with_block_scales / with_mx_scales check that on the way in). Seeds: three small
// experts, float32, FP8 with block scales and MXFP4 with biases (fuzz/corpus/expert_weights).
#include <cstdint>
#include <cstdlib>

#include "core/check.h"
#include "moe/ep/expert_weights_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const r3::moe::ep::Buffer message(bytes, bytes + size);
  try {
    for (r3::moe::ep::ExpertReader reader(message, 1); !reader.done();) {
      const auto [slot, w] = reader.next();
      for (const r3::Tensor* t : {&w.gate, &w.up, &w.down}) {
        if (!t->defined() || t->nbytes() > size) std::abort();  // a tensor larger than its message
      }
    }
  } catch (const r3::Error&) {
  }
  return 0;
}
