// One thread per rank of an in-process group: run(fn) calls fn(rank) for every rank at once, rank 0 on
// the caller's thread, and returns when all are done. A rank that throws aborts the group's
// collectives, so the others stop instead of waiting for it; run then rethrows the first rank's own
// error (not the others' "the group stopped" errors) and leaves the group usable again.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/in_process.h"

namespace ingot {

class RankThreads {
 public:
  explicit RankThreads(InProcessGroup& group);
  ~RankThreads();  // joins the threads (after the task in flight, if any)
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  void run(const std::function<void(int rank)>& fn);

 private:
  struct Worker {
    std::thread thread;
    const std::function<void(int)>* task = nullptr;  // set by run, cleared when done
    std::exception_ptr error;
  };
  void loop(int rank);
  // fn(rank) with its error recorded and the group aborted on failure.
  void call(int rank, const std::function<void(int)>& fn, std::exception_ptr& error);

  InProcessGroup& group_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t round_ = 0;
  int pending_ = 0;
  std::vector<Worker> workers_;  // [world]; rank 0's entry has no thread
};

}  // namespace ingot
