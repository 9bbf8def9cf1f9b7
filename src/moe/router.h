// A router turns hidden states into a Routing: scores, a selection (or a forced routing when
// replaying), then weights. In the modular path the router is also the capture point: route()
// hands its logical ids to the capture sink before anyone can map them.
#pragma once

#include <span>
#include <string>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "moe/capture.h"

namespace r3::moe {

class Router {
 public:
  explicit Router(int64_t layer_id) : layer_id_(layer_id) {}
  virtual ~Router() = default;

  int64_t layer_id() const { return layer_id_; }
  virtual int64_t num_experts() const = 0;
  virtual int64_t top_k() const = 0;
  virtual std::string name() const = 0;

  // hidden: F32 [tokens, hidden]. forced: [tokens, top_k] logical ids to use instead of the
  // router's own selection (replay), or empty; weights then come from the router's own scores
  // at those ids. Checks forced ids are in range and distinct within a row.
  Routing compute(ThreadPool& pool, const Tensor& hidden, std::span<const int32_t> forced) const;
  // compute() followed by the capture point (the modular path).
  CapturedRouting route(ThreadPool& pool, const Tensor& hidden, std::span<const int32_t> forced) const {
    return capture(compute(pool, hidden, forced), layer_id_, sink_);
  }

  void set_capture(CaptureSink sink) { sink_ = std::move(sink); }

 protected:
  // Fills out (already sized [tokens, top_k]) from the hidden states.
  virtual void select(ThreadPool& pool, const Tensor& hidden, std::span<const int32_t> forced,
                      Routing& out) const = 0;

 private:
  int64_t layer_id_;
  CaptureSink sink_;
};

// Checks a forced routing [tokens, top_k]: ids within [0, num_experts), distinct in each row.
void check_forced_routing(std::span<const int32_t> forced, int64_t tokens, int64_t top_k,
                          int64_t num_experts, int64_t layer_id);

}  // namespace r3::moe
