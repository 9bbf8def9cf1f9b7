// Progress lines for long work (checkpoint loading), printed on stderr only once the work has
// taken longer than a moment, and at most a few times per second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace r3 {

class Progress {
 public:
  // Nothing is printed during the first `quiet_period`; then at most one line per
  // `print_interval`, and a final line when done.
  Progress(std::string label, uint64_t total, std::string unit = "MB", double unit_scale = 1e6,
           std::chrono::milliseconds quiet_period = std::chrono::milliseconds(500),
           std::chrono::milliseconds print_interval = std::chrono::milliseconds(250));
  ~Progress();  // prints the final line if anything was printed before

  void advance(uint64_t amount);

 private:
  void print(bool final_line);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::string unit_;
  double unit_scale_;
  std::chrono::milliseconds quiet_period_;
  std::chrono::milliseconds print_interval_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  bool printed_ = false;
};

}  // namespace r3
