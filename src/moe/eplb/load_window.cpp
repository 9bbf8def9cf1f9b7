#include "moe/eplb/load_window.h"

#include "core/check.h"

namespace r3::moe {

LoadWindow::LoadWindow(int64_t num_physical, int64_t window_steps) {
  R3_CHECK(window_steps >= 1, "EPLB window must be >= 1 step, got ", window_steps);
  steps_.assign(static_cast<std::size_t>(window_steps), std::vector<int64_t>(static_cast<std::size_t>(num_physical), 0));
}

void LoadWindow::add(int32_t physical, int64_t tokens) { steps_[current_].at(static_cast<std::size_t>(physical)) += tokens; }

void LoadWindow::end_step() {
  current_ = (current_ + 1) % steps_.size();
  std::fill(steps_[current_].begin(), steps_[current_].end(), 0);
}

void LoadWindow::reset() {
  for (auto& s : steps_) std::fill(s.begin(), s.end(), 0);
}

std::vector<int64_t> LoadWindow::totals() const {
  std::vector<int64_t> sum(steps_[0].size(), 0);
  for (const auto& s : steps_) {
    for (std::size_t p = 0; p < s.size(); ++p) sum[p] += s[p];
  }
  return sum;
}

}  // namespace r3::moe
