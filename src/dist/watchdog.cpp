#include "dist/watchdog.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace ingot {

std::chrono::seconds tp_timeout_from_env() {
  const char* e = std::getenv("INGOT_TP_TIMEOUT_S");
  long s = 300;
  if (e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end != '\0' || v < 1 || v > 86400)
      throw Error("INGOT_TP_TIMEOUT_S=" + std::string(e) + " is not a whole number of seconds in [1, 86400]");
    s = v;
  }
  return std::chrono::seconds(s);
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Watchdog::Watchdog(std::chrono::milliseconds limit, std::function<void(int64_t)> on_expired)
    : limit_(limit), on_expired_(std::move(on_expired)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Watchdog::begin() {
  if (depth_.fetch_add(1) == 0) since_ns_.store(std::max<int64_t>(now_ns(), 1));
}

void Watchdog::end() {
  if (depth_.fetch_sub(1) == 1) since_ns_.store(0);
}

void Watchdog::run() {
  // A look every quarter of the limit, at most every 100 ms: an expiry is seen within that of its time.
  const auto period = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(100),
                                                          std::max<std::chrono::milliseconds>(limit_ / 4, std::chrono::milliseconds(1)));
  std::unique_lock<std::mutex> l(mu_);
  while (!cv_.wait_for(l, period, [this] { return stop_; })) {
    const int64_t since = since_ns_.load();
    if (since == 0 || fired_.load()) continue;
    const int64_t waited = now_ns() - since;
    if (waited < std::chrono::duration_cast<std::chrono::nanoseconds>(limit_).count()) continue;
    fired_.store(true);
    l.unlock();
    on_expired_(waited / 1000000000);
    l.lock();
  }
}

}  // namespace ingot
