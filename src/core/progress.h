// Progress of long work (checkpoint loading) on stderr, shown only once the work has taken longer
// than a moment. On a terminal it is one line rewritten in place; elsewhere (a log file, a pipe)
// it is a few log lines, so that logs stay short.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace r3 {

class Progress {
 public:
  // Nothing is shown during the first `quiet_period`. Then, on `terminal` (an interactive
  // stream, or nullptr for none): the line is redrawn at most once per `print_interval` and
  // ends with a newline when done. Without a terminal: a log line at most once per quarter of
  // the work, and the final line. Both are silent when the log level hides info (-q).
  Progress(std::string label, uint64_t total, std::string unit = "MB", double unit_scale = 1e6,
           std::chrono::milliseconds quiet_period = std::chrono::milliseconds(500),
           std::chrono::milliseconds print_interval = std::chrono::milliseconds(250),
           std::FILE* terminal = stderr_if_terminal());
  ~Progress();  // shows the final line if anything was shown before

  void advance(uint64_t amount);
  // Text shown after the counts and time from the next line on, e.g. a rate ("850 tokens/s").
  void set_detail(std::string detail) { detail_ = std::move(detail); }

  static std::FILE* stderr_if_terminal();  // stderr when it is a terminal, else nullptr

 private:
  std::string text(bool final_line) const;
  void show(bool final_line);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::string unit_;
  double unit_scale_;
  std::chrono::milliseconds quiet_period_;
  std::chrono::milliseconds print_interval_;
  std::string detail_;
  std::FILE* terminal_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  uint64_t quarters_shown_ = 0;  // without a terminal: the last quarter a line was logged for
  bool shown_ = false;
};

}  // namespace r3
