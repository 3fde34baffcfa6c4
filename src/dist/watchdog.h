// A deadline on the waits that cannot time out by themselves: a tensor-parallel rank's host waiting
// for device work that holds collectives (a step's read-back, a barrier's stream sync). NCCL has no
// timeout of its own, so a peer that is alive but never joins a collective (stuck in its host code, or
// a bug that skips a call) would leave this rank waiting for ever; a peer that dies is the process
// group's watch's (process_group.h). The watchdog's thread sees a wait pass its limit and calls
// on_expired once, from that thread; the NCCL communicator then aborts itself, its kernels return, the
// wait ends and check_usable() turns what it read into GroupStopped naming the limit.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ingot {

// INGOT_TP_TIMEOUT_S: how long a rank waits for its peers, in whole seconds in [1, 86400] (default
// 300: far past any step, long enough for a peer still loading a large model behind a fast one). A
// bad value is an Error naming the variable.
std::chrono::seconds tp_timeout_from_env();

class Watchdog {
 public:
  // on_expired(how long the wait had lasted, in whole seconds).
  Watchdog(std::chrono::milliseconds limit, std::function<void(int64_t waited_s)> on_expired);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A wait starts and ends (nested pairs time the outermost). Two atomic operations each: the thread
  // looks at the clock a few times a second, not at every step.
  void begin();
  void end();
  bool expired() const { return fired_.load(); }

  // Marks a wait for as long as it lives; a null watchdog marks nothing.
  class Wait {
   public:
    explicit Wait(Watchdog* w) : w_(w) {
      if (w_) w_->begin();
    }
    ~Wait() {
      if (w_) w_->end();
    }
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;

   private:
    Watchdog* w_;
  };

 private:
  void run();
  const std::chrono::milliseconds limit_;
  const std::function<void(int64_t)> on_expired_;
  std::atomic<int> depth_{0};
  std::atomic<int64_t> since_ns_{0};  // steady clock of the outermost begin; 0 while no wait runs
  std::atomic<bool> fired_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ingot
