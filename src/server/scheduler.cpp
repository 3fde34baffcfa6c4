#include "server/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace ingot::server {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

void Channel::push(ChoiceEvent e) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

std::vector<ChoiceEvent> Channel::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [&] { return !events_.empty(); });
  std::vector<ChoiceEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

Scheduler::Scheduler(Generator& gen, Metrics& metrics, size_t max_queue, int64_t capacity,
                     std::function<void(const std::string&)> on_broken)
    : gen_(gen), metrics_(metrics), on_broken_(std::move(on_broken)), max_queue_(max_queue), capacity_(capacity) {
  publish(0);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  close();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Channel> Scheduler::submit(std::vector<Request> choices) {
  auto ch = std::make_shared<Channel>();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return nullptr;
    // Choices that would wait for a slot: those in the inbox, those the generator holds without a
    // slot, and these, less the slots free as of the last step.
    const size_t free_slots = size_t(gauges_.slots_total - gauges_.slots_busy);
    const size_t waiting = inbox_choices_ + size_t(gauges_.queued) + choices.size();
    if (waiting > max_queue_ + free_slots) return nullptr;
    inbox_choices_ += choices.size();
    inbox_.push_back(Pending{std::move(choices), ch});
  }
  wake_.notify_one();
  return ch;
}

void Scheduler::close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
  }
  wake_.notify_one();
}

LoadGauges Scheduler::gauges() const {
  std::lock_guard<std::mutex> l(mu_);
  LoadGauges g = gauges_;
  g.queued += int64_t(inbox_choices_);
  return g;
}

std::vector<SlotView> Scheduler::slots() const {
  std::lock_guard<std::mutex> l(mu_);
  return slots_;
}

void Scheduler::submit_now(Pending& p) {
  for (size_t i = 0; i < p.choices.size(); ++i) {
    Request& r = p.choices[i];
    const int choice = int(i);
    std::shared_ptr<Channel> ch = p.channel;
    r.on_token = [ch, choice](const TokenEvent& e) {
      if (e.logprob) ch->push(ChoiceEvent{choice, std::string(e.text), false, false, {}, e.id, *e.logprob});
      else if (!e.text.empty()) ch->push(ChoiceEvent{choice, std::string(e.text), false, false, {}, -1, {}});
    };
    auto cancel = r.cancel;
    r.on_done = [this, ch, choice, cancel](const Completion& c) {
      metrics_.count_finished(stop_reason_name(c.stop), c.prompt_tokens, c.computed_prompt_tokens, int64_t(c.ids.size()),
                              c.ttft_s, c.decode_s);
      ch->push(ChoiceEvent{choice, {}, true, false, c, -1, {}});
      cancels_.erase(std::remove(cancels_.begin(), cancels_.end(), cancel), cancels_.end());
    };
    try {
      if (r.cancel) cancels_.push_back(r.cancel);
      gen_.submit(std::move(r));
    } catch (const std::exception& e) {
      // Checked by the HTTP layer before queueing; a refusal here is answered all the same.
      if (cancel) cancels_.erase(std::remove(cancels_.begin(), cancels_.end(), cancel), cancels_.end());
      Completion c;
      c.stop = StopReason::Error;
      c.error = e.what();
      p.channel->push(ChoiceEvent{choice, {}, true, true, c, -1, {}});
    }
  }
}

void Scheduler::publish(size_t taken) {
  LoadGauges g;
  g.queued = int64_t(gen_.queued());
  g.slots_busy = gen_.busy_slots();
  g.slots_total = gen_.slots();
  g.kv_positions_total = int64_t(gen_.slots()) * capacity_;
  std::vector<SlotView> views;
  for (int s = 0; s < gen_.slots(); ++s) {
    views.push_back(SlotView{s, gen_.slot_info(s)});
    g.kv_positions_used += views.back().info.cached;
  }
  std::lock_guard<std::mutex> l(mu_);
  // Choices leave the inbox's count only now that the generator's queue counts them.
  inbox_choices_ -= taken;
  gauges_ = g;
  slots_ = std::move(views);
}

void Scheduler::loop() {
  for (;;) {
    std::deque<Pending> batch;
    bool closing = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      // Sleep only when the generator has nothing to do.
      wake_.wait(l, [&] { return closed_ || !inbox_.empty() || !gen_.idle(); });
      batch.swap(inbox_);
      closing = closed_;
    }
    size_t taken = 0;
    for (Pending& p : batch) {
      taken += p.choices.size();
      submit_now(p);
    }
    if (closing) {
      // Everything still queued or running stops at the next step; its done events are sent.
      for (auto& c : cancels_) c->store(true);
      while (!gen_.idle()) gen_.step();
      publish(taken);
      return;
    }
    const auto t0 = Clock::now();
    if (!gen_.idle()) {
      try {
        gen_.step();
        const StepStats& st = gen_.last_step();
        if (st.model_calls > 0) {
          const char* kind = st.prefill_rows == 0 ? "decode" : st.decode_rows == 0 ? "prefill" : "mixed";
          metrics_.count_step(kind, seconds(t0, Clock::now()), st.decode_rows, st.prefill_tokens, st.launch_s, st.wait_s);
        }
      } catch (const std::exception& e) {
        // step() fails requests, not itself, on a model error; what escapes it (out of memory in the
        // bookkeeping) is reported and the loop goes on, so the server keeps answering.
        std::fprintf(stderr, "ingot serve: generator step failed: %s\n", e.what());
      }
      if (!gen_.broken().empty() && !std::exchange(told_broken_, true) && on_broken_) on_broken_(gen_.broken());
    }
    const auto t1 = Clock::now();
    publish(taken);
    if (busy_since_step_) metrics_.count_scheduler_overhead(seconds(*busy_since_step_, t0) + seconds(t1, Clock::now()));
    if (gen_.idle()) busy_since_step_.reset();
    else busy_since_step_ = Clock::now();
  }
}

}  // namespace ingot::server
