// parallel_ranges (core/parallel.h): every item exactly once, in ranges that tile [0, n), and a
// range's error reaches the caller after every thread has joined.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/parallel.h"

namespace ingot {
namespace {

TEST(ParallelRanges, TileTheItemsExactlyOnce) {
  for (int64_t n : {0, 1, 7, 64, 1000, 4099})
    for (int64_t min_items : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      parallel_ranges(n, min_items, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) seen[size_t(i)]++;
        std::lock_guard<std::mutex> lock(mu);
        ranges.emplace_back(b, e);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[size_t(i)].load(), 1) << "n " << n << " item " << i;
      for (const auto& [b, e] : ranges) EXPECT_LT(b, e) << "an empty range was run (n " << n << ")";
      // No more ranges than min_items-sized pieces fit (small jobs stay whole), and at least one.
      EXPECT_LE(int64_t(ranges.size()), std::max<int64_t>(1, n / min_items)) << "n " << n << " min " << min_items;
      EXPECT_EQ(ranges.empty(), n == 0);
    }
}

TEST(ParallelRanges, AnErrorInAnyRangeReachesTheCaller) {
  std::atomic<int64_t> done{0};
  EXPECT_THROW(parallel_ranges(1 << 16, 1, [&](int64_t b, int64_t e) {
                 if (b <= 40000 && 40000 < e) throw std::runtime_error("item 40000");
                 done += e - b;
               }),
               std::runtime_error);
  EXPECT_LT(done.load(), int64_t(1) << 16);  // the failing range's items were not all counted
}

}  // namespace
}  // namespace ingot
