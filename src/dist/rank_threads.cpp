#include "dist/rank_threads.h"

#include "core/error.h"

namespace ingot {

RankThreads::RankThreads(InProcessGroup& group) : group_(group), workers_(size_t(group.world())) {
  for (int r = 1; r < group.world(); ++r) workers_[size_t(r)].thread = std::thread([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (Worker& w : workers_)
    if (w.thread.joinable()) w.thread.join();
}

void RankThreads::call(int rank, const std::function<void(int)>& fn, std::exception_ptr& error) {
  try {
    fn(rank);
  } catch (const std::exception& e) {
    error = std::current_exception();
    group_.abort(rank, e.what());
  } catch (...) {
    error = std::current_exception();
    group_.abort(rank, "unknown error");
  }
}

void RankThreads::loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || round_ != seen; });
      if (stopping_) return;
      seen = round_;
      task = workers_[size_t(rank)].task;
    }
    std::exception_ptr error;
    call(rank, *task, error);
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers_[size_t(rank)].error = error;
      workers_[size_t(rank)].task = nullptr;
      --pending_;
    }
    cv_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int rank)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t r = 1; r < workers_.size(); ++r) {
      workers_[r].task = &fn;
      workers_[r].error = nullptr;
    }
    pending_ = int(workers_.size()) - 1;
    ++round_;
  }
  cv_.notify_all();
  std::exception_ptr first;
  call(0, fn, first);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }
  // The error to report: the lowest rank's own failure, ahead of the errors of ranks that only saw
  // the group stop (those say which rank failed, so they are the fallback).
  std::exception_ptr own = nullptr, any = first;
  for (size_t r = 0; r < workers_.size(); ++r) {
    std::exception_ptr e = r == 0 ? first : workers_[r].error;
    if (!e) continue;
    if (!any) any = e;
    try {
      std::rethrow_exception(e);
    } catch (const GroupStopped&) {
    } catch (...) {
      if (!own) own = e;
    }
  }
  if (!any) return;
  group_.reset();
  std::rethrow_exception(own ? own : any);
}

}  // namespace ingot
