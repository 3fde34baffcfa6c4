// A one-line progress bar on stderr for long steps (hashing, writing, verifying weights). Drawn only
// when stderr is a terminal and the user did not ask for quiet, so logs and pipes stay clean.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "io/engine_file.h"

namespace ingot::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, bool quiet);
  ~ProgressBar();  // clears the line
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(uint64_t done, uint64_t total);
  // A callback for library functions that report progress; valid while this bar lives.
  ProgressFn fn();

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  int last_permille_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace ingot::cli
