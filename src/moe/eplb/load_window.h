// Tokens routed to each physical expert, per step, over a sliding window of recent steps.
#pragma once

#include <cstdint>
#include <vector>

namespace r3::moe {

class LoadWindow {
 public:
  LoadWindow(int64_t num_physical, int64_t window_steps);

  void add(int32_t physical, int64_t tokens = 1);
  void end_step();  // the oldest step leaves the window
  void reset();
  // Sum over the window, per physical expert.
  std::vector<int64_t> totals() const;
  int64_t window_steps() const { return static_cast<int64_t>(steps_.size()); }

 private:
  std::vector<std::vector<int64_t>> steps_;  // ring of per-step counts
  std::size_t current_ = 0;
};

}  // namespace r3::moe
