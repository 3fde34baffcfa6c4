// The in-process communicator: the ranks of a group are threads of one process, each with its own
// backend over host memory (the CPU backend). Ranks meet at a barrier; each collective publishes every
// rank's buffer address in a shared table, then every rank reads the others' buffers directly. It is
// what CI runs tensor parallelism on, so that the split is tested against one rank without GPUs.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace ingot {

// What a rank's collective throws when another rank failed and stopped the group.
class GroupStopped : public Error {
 public:
  using Error::Error;
};

class InProcessGroup {
 public:
  // world in [1, kMaxTensorParallel].
  explicit InProcessGroup(int world);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int world() const { return world_; }
  // Rank r's communicator, owned by the group (one per rank, to be used by one thread at a time).
  Communicator& comm(int rank);

  // A rank that fails calls this so that the others, waiting for it in a collective, throw an Error
  // naming it instead of waiting forever. Until reset(), every collective throws.
  void abort(int rank, const std::string& why);
  // Once no rank is inside a collective (the caller joined them all): the group is usable again.
  void reset();

 private:
  class Rank;
  friend class Rank;
  // Waits until every rank has arrived (the generation advanced); throws when the group is aborted.
  void arrive_and_wait();

  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<const void*> published_;  // [world] each rank's buffer in the current collective
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace ingot
