// parallel_ranges: split [0, n) into contiguous ranges run on up to hardware_concurrency threads (the
// caller's included), for host work whose items are independent (quantizing rows, filling random
// weights). Each item's result does not depend on how the range was cut, so the output is the same on
// any machine. An exception from a range is rethrown on the caller's thread after all have joined.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace ingot {

// fn(begin, end) over ranges of at least `min_items` items (small jobs stay on the caller's thread).
template <class Fn>
void parallel_ranges(int64_t n, int64_t min_items, Fn&& fn) {
  if (n <= 0) return;
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t parts = std::clamp<int64_t>(n / std::max<int64_t>(1, min_items), 1, hw);
  if (parts == 1) return fn(int64_t(0), n);
  const int64_t per = (n + parts - 1) / parts;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(parts));
  auto run = [&](int64_t p) {
    try {
      fn(p * per, std::min(n, (p + 1) * per));
    } catch (...) {
      errors[size_t(p)] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int64_t p = 1; p < parts && p * per < n; ++p) pool.emplace_back(run, p);
  run(0);
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ingot
