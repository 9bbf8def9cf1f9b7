// One MoE layer, and the single place where its pipeline is written:
//
//   hidden -> router -> CAPTURE(logical ids) -> experts -> combine
//
// Capture sits between selection and anything that consumes the ids, so every family and
// every path records the logical expert ids the router chose.
#pragma once

#include <memory>

#include "moe/router.h"
#include "moe/routing_capture.h"
#include "moe/swiglu_experts.h"

namespace r3::moe {

class MoeLayer {
 public:
  // moe_layer_id: index among the model's MoE layers, assigned when the model is built.
  MoeLayer(int64_t moe_layer_id, std::unique_ptr<Router> router, SwigluExperts experts);

  int64_t moe_layer_id() const { return moe_layer_id_; }
  const Router& router() const { return *router_; }

  // hidden, out: F32 [tokens, hidden]. `capture` may be null (no capture requested).
  void forward(ThreadPool& pool, const Tensor& hidden, RoutingCapture* capture, Tensor& out) const;

 private:
  int64_t moe_layer_id_;
  std::unique_ptr<Router> router_;
  SwigluExperts experts_;
};

}  // namespace r3::moe
