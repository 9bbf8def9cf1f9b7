#include "core/progress.h"

#include <spdlog/spdlog.h>

namespace r3 {

Progress::Progress(std::string label, uint64_t total, std::string unit, double unit_scale,
                   std::chrono::milliseconds quiet_period, std::chrono::milliseconds print_interval)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      unit_scale_(unit_scale),
      quiet_period_(quiet_period),
      print_interval_(print_interval),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

Progress::~Progress() {
  if (printed_) print(true);
}

void Progress::advance(uint64_t amount) {
  done_ += amount;
  auto now = std::chrono::steady_clock::now();
  if (now - start_ < quiet_period_ || now - last_print_ < print_interval_) return;
  last_print_ = now;
  print(false);
}

void Progress::print(bool final_line) {
  printed_ = true;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double pct = total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  spdlog::info("{}: {:.0f}% ({:.1f}/{:.1f} {}, {:.1f} s){}", label_, pct,
               static_cast<double>(done_) / unit_scale_, static_cast<double>(total_) / unit_scale_,
               unit_, seconds, final_line ? " done" : "");
}

}  // namespace r3
