// The modular path: a router object (which owns the capture hook), the EPLB map, and grouped
// expert GEMMs over tokens permuted by expert.
#pragma once

#include "moe/moe_block.h"

namespace r3::moe {

class ModularMoe final : public MoeBlock {
 public:
  ModularMoe(std::unique_ptr<Router> router, std::shared_ptr<PhysicalExperts> experts);

  std::string path_name() const override { return "modular"; }
  Router* capture_router() override { return router_.get(); }
  Gate gate() const override { return {router_->gate_weight(), router_->gate_bias(), router_->rule()}; }
  void forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const override;

 private:
  std::unique_ptr<Router> router_;
};

}  // namespace r3::moe
