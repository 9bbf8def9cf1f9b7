#include "core/progress.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace r3 {

Progress::Progress(std::string label, uint64_t total, std::string unit, double unit_scale,
                   std::chrono::milliseconds quiet_period, std::chrono::milliseconds print_interval,
                   std::FILE* terminal)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      unit_scale_(unit_scale),
      quiet_period_(quiet_period),
      print_interval_(print_interval),
      terminal_(terminal),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

Progress::~Progress() {
  if (shown_) show(true);
}

std::FILE* Progress::stderr_if_terminal() { return isatty(STDERR_FILENO) ? stderr : nullptr; }

void Progress::advance(uint64_t amount) {
  done_ += amount;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < quiet_period_) return;
  if (terminal_ != nullptr) {
    if (now - last_print_ < print_interval_) return;
    last_print_ = now;
  } else {
    // A line per quarter reached; the last quarter is the final line, shown once at the end.
    const uint64_t quarters = total_ ? 4 * done_ / total_ : 4;
    if (quarters <= quarters_shown_ || quarters >= 4) return;
    quarters_shown_ = quarters;
  }
  show(false);
}

std::string Progress::text(bool final_line) const {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double pct = total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  // Unscaled units are counts (requests, files): whole numbers.
  const int decimals = unit_scale_ == 1.0 ? 0 : 1;
  return fmt::format("{}: {:.0f}% ({:.{}f}/{:.{}f} {}, {:.1f} s{}{}){}", label_, pct,
                     static_cast<double>(done_) / unit_scale_, decimals, static_cast<double>(total_) / unit_scale_,
                     decimals, unit_, seconds, detail_.empty() ? "" : ", ", detail_, final_line ? " done" : "");
}

void Progress::show(bool final_line) {
  shown_ = true;
  if (terminal_ == nullptr) {
    spdlog::info("{}", text(final_line));
    return;
  }
  if (!spdlog::should_log(spdlog::level::info)) return;
  // Back to the line start, the new text, erase what is left of a longer previous text.
  fmt::print(terminal_, "\r{}\033[K{}", text(final_line), final_line ? "\n" : "");
  std::fflush(terminal_);
}

}  // namespace r3
