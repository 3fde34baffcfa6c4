#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace ingot::cli {

ProgressBar::ProgressBar(std::string label, bool quiet)
    : label_(std::move(label)), enabled_(!quiet && ::isatty(STDERR_FILENO)) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\r%*s\r", 79, "");
}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  const int permille = int(done * 1000 / total);
  const auto now = std::chrono::steady_clock::now();
  // Redraw at most every 50 ms, and always at the end, so huge models do not flood the terminal.
  if (permille == last_permille_ || (permille < 1000 && now - last_draw_ < std::chrono::milliseconds(50))) return;
  last_permille_ = permille;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int fill = permille * kWidth / 1000;
  std::string bar(size_t(fill), '#');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r%-12s [%s] %5.1f%%  %.2f / %.2f GB", label_.c_str(), bar.c_str(), permille / 10.0, done / 1e9,
               total / 1e9);
  std::fflush(stderr);
  drawn_ = true;
}

ProgressFn ProgressBar::fn() {
  return [this](uint64_t done, uint64_t total) { update(done, total); };
}

}  // namespace ingot::cli
