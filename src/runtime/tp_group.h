// An in-process tensor-parallel group behind one Model (runtime/model.h): the slices of the engine,
// ranks 1..world-1's backends and Models (rank 0 is the Model that owns the group), the
// communicators and one thread per rank. Model's public calls run the same call on every rank through
// run(); rank 0's result is what the caller sees, and every rank's is bitwise the same.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "dist/in_process.h"
#include "dist/process_group.h"
#include "dist/rank_threads.h"
#include "io/engine.h"
#include "runtime/memory_plan.h"

namespace ingot {

class Model;

class TpGroup {
 public:
  // Null when options.tp is 1. Otherwise refuses what cannot be split (check_tensor_parallel) and a
  // backend that is not the CPU's (tensor parallelism on the GPU is not there yet), then slices the
  // engine once per rank.
  static std::unique_ptr<TpGroup> make(const Engine& engine, const Backend& backend, const RuntimeOptions& options);
  // Over slices already made (per-rank engine files, runtime/tp_engine_dir.h): shards[r] is rank r's,
  // checked by the loader against the manifest; they are borrowed and must outlive the group.
  static std::unique_ptr<TpGroup> from_shards(const std::vector<Engine>& shards, const Backend& backend,
                                              const RuntimeOptions& options);
  ~TpGroup();

  int world() const { return comms_.world(); }
  // Ranks as processes (INGOT_TP_PROCESSES=1, dist/process_group.h): this process is one rank, and
  // shard(0), comm(0) and run() are that rank's, whichever it is; every process runs the same calls.
  bool processes() const { return procs_ != nullptr; }
  const Engine& shard(int rank) const { return shards_[size_t(rank)]; }
  Communicator& comm(int rank) { return procs_ ? procs_->comm() : comms_.comm(rank); }
  // Makes ranks 1..world-1: a CPU backend and a Model over its slice each, in the rank's own thread.
  void start_peers(const RuntimeOptions& options);
  Model& peer(int rank) { return *peers_[size_t(rank)]; }
  // fn(rank) on every rank's thread at once (rank 0 on the caller's); rethrows the failing rank's error.
  void run(const std::function<void(int rank)>& fn) {
    if (procs_) return fn(0);
    threads_.run(fn);
  }

 private:
  explicit TpGroup(int world);
  std::unique_ptr<ProcessGroup> procs_;  // ranks as processes; then comms_ and threads_ stay idle
  InProcessGroup comms_;
  std::vector<Engine> shards_;                     // [world]
  std::vector<std::unique_ptr<Backend>> backends_;  // [world]; rank 0 runs on the Model's own backend
  std::vector<std::unique_ptr<Model>> peers_;      // [world]; rank 0 is the owner
  RankThreads threads_;                            // last: joined before the Models go
};

}  // namespace ingot
