// A router turns hidden states into a Routing: scores, a selection, then weights.
// Each scoring/selection rule is one Router implementation; the MoE layer owns one.
#pragma once

#include <string>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "moe/routing.h"

namespace r3::moe {

class Router {
 public:
  virtual ~Router() = default;
  virtual int64_t num_experts() const = 0;
  virtual int64_t top_k() const = 0;
  virtual std::string name() const = 0;
  // hidden: F32 [tokens, hidden]; fills `out` with [tokens, top_k] ids and weights.
  virtual void route(ThreadPool& pool, const Tensor& hidden, Routing& out) const = 0;
};

}  // namespace r3::moe
