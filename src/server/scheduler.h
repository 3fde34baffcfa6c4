// The one thread that owns the Generator. The Generator is single-threaded by design (one thread calls
// submit/step), so HTTP threads never touch it: they hand a request's choices to submit(), which puts
// them in a mutex-protected inbox and wakes the scheduler thread; that thread submits them, steps the
// generator while work remains, and pushes every streamed piece and every finished choice into the
// request's Channel, on which the HTTP thread waits. Cancellation goes the other way through the
// request's shared atomic flag (a client that disconnects sets it), which the generator reads at the
// start of each step, so the slot frees within one step.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/generator.h"
#include "server/metrics.h"

namespace ingot::server {

// One event of one choice: a piece of text (done = false) or its end (done = true, with the result).
struct ChoiceEvent {
  int choice = 0;
  std::string text;
  bool done = false;
  bool rejected = false;  // the generator refused the request at submit (result.error says why)
  Completion result;
  // A generated token of a request that asked for log-probabilities (token -1 otherwise): such
  // requests get one event per token, even one that released no text.
  int32_t token = -1;
  TokenLogprob logprob;
};

// One HTTP request's events, written by the scheduler thread, read by the HTTP thread.
class Channel {
 public:
  void push(ChoiceEvent e);
  // The events queued so far, waiting up to `timeout` for the first; empty when none came.
  std::vector<ChoiceEvent> take(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> events_;
};

// Slot states for /slots, as of the last step.
struct SlotView {
  int slot = 0;
  SlotInfo info;
};

class Scheduler {
 public:
  // The generator must outlive the scheduler. max_queue: choices that may wait for a slot. on_broken:
  // called once, on the scheduler's thread, when the generator's model can run no more
  // (Generator::broken: a tensor-parallel rank ended), with the reason.
  Scheduler(Generator& gen, Metrics& metrics, size_t max_queue, int64_t capacity,
            std::function<void(const std::string&)> on_broken = {});
  ~Scheduler();  // close(), then joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request's choices (their callbacks are set here) together, or returns null when the
  // queue has no room for all of them (the caller answers 503) or the scheduler is closed.
  std::shared_ptr<Channel> submit(std::vector<Request> choices);
  // Cancels everything queued or running and stops taking requests; every channel gets its done
  // events before the thread ends.
  void close();

  LoadGauges gauges() const;
  std::vector<SlotView> slots() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    std::vector<Request> choices;
    std::shared_ptr<Channel> channel;
  };
  void loop();
  void submit_now(Pending& p);
  void publish(size_t taken);  // gauges and slot views after a step; `taken` choices left the inbox

  Generator& gen_;
  Metrics& metrics_;
  std::function<void(const std::string&)> on_broken_;
  bool told_broken_ = false;  // scheduler thread
  const size_t max_queue_;
  const int64_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> inbox_;
  size_t inbox_choices_ = 0;
  bool closed_ = false;
  LoadGauges gauges_;
  std::vector<SlotView> slots_;
  std::vector<std::shared_ptr<std::atomic<bool>>> cancels_;  // of the choices in the generator (scheduler thread)
  // When the last step ended with work left (scheduler thread): the loop's time from then to the next
  // step is overhead; after an idle step it is waiting, and not counted.
  std::optional<Clock::time_point> busy_since_step_;
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace ingot::server
