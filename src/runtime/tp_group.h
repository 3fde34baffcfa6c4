// A tensor-parallel group behind one Model (runtime/model.h). Ranks as threads (the CPU): the slices
// of the engine, ranks 1..world-1's backends and Models (rank 0 is the Model that owns the group), the
// communicators and one thread per rank; Model's public calls run the same call on every rank through
// run(); rank 0's result is what the caller sees, and every rank's is bitwise the same. Ranks as
// processes (always on the GPU, one process per GPU; INGOT_TP_PROCESSES=1 on the CPU): this process's
// slice and its RankProcess, every process running the same calls.
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

// Whether the ranks of a --tp run are processes: always on the GPU (one process per GPU; refused when
// INGOT_TP_PROCESSES=0 asks for threads there), on the CPU when INGOT_TP_PROCESSES=1. Throws Error for
// a value of INGOT_TP_PROCESSES other than 0 or 1.
bool tp_ranks_are_processes(bool gpu);

// This process's rank in a group whose ranks are processes: the process group (dist/process_group.h)
// and the communicator the Models' collectives go through: NCCL over the group on the GPU
// (dist/nccl_communicator.h), the group's own on the CPU. Made once per process and shared by every
// Model made over it (bench makes one Model per run), so that each process's n-th Model pairs with the
// others' n-th; NCCL's communicator is bound to one backend's stream and GPU.
class RankProcess {
 public:
  // ProcessGroup::start(options) (rank 0 starts the workers; a worker or an mpirun rank joins), then on
  // a backend with a native stream (CUDA) the NCCL communicator over it. `backend` must outlive this.
  static std::shared_ptr<RankProcess> start(const ProcessGroupOptions& options, Backend& backend);
  // start() with the defaults: this executable and command line for the workers, world ranks.
  static std::shared_ptr<RankProcess> start(int world, Backend& backend);
  ~RankProcess();
  int rank() const { return group_->rank(); }
  int world() const { return group_->world(); }
  // What the Models' collectives go through (device buffers on the GPU).
  Communicator& comm() { return device_ ? *device_ : group_->comm(); }
  // The host group: collectives over host memory (what the GPU tests compare ranks with).
  ProcessGroup& group() { return *group_; }
  // The orderly end: NCCL's communicator first (every rank destroys its own while the group still
  // stands, so none waits on a peer that already left), then ProcessGroup::close. Afterwards only the
  // destructor may be called.
  std::vector<ProcessGroup::Ended> close(std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  RankProcess() = default;
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<Communicator> device_;  // NCCL on the GPU, else null; after group_, so destroyed first
};

class TpGroup {
 public:
  // Null when options.tp is 1. Otherwise refuses what cannot be split (check_tensor_parallel), then
  // slices the engine: once per rank for threads; for processes this process's rank only, over `ranks`
  // when given (it must have options.tp ranks), else over a RankProcess started here.
  static std::unique_ptr<TpGroup> make(const Engine& engine, Backend& backend, const RuntimeOptions& options,
                                       std::shared_ptr<RankProcess> ranks = nullptr);
  // Over slices already made (per-rank engine files, runtime/tp_engine_dir.h): shards[r] is rank r's,
  // checked by the loader against the manifest; they are borrowed and must outlive the group. With
  // `ranks` (ranks as processes): shards is this process's rank's slice alone, taken as its shard
  // without slicing again.
  static std::unique_ptr<TpGroup> from_shards(const std::vector<Engine>& shards, Backend& backend,
                                              const RuntimeOptions& options, std::shared_ptr<RankProcess> ranks = nullptr);
  ~TpGroup();

  int world() const { return comms_.world(); }
  // Ranks as processes (RankProcess): this process is one rank, and shard(0), comm(0) and run() are
  // that rank's, whichever it is; every process runs the same calls.
  bool processes() const { return procs_ != nullptr; }
  // Ranks as processes: this process's rank, and the process group's own communicator (host memory,
  // whatever the Models' collectives go through); -1 and null otherwise.
  int process_rank() const { return procs_ ? procs_->rank() : -1; }
  Communicator* host_comm() { return procs_ ? &procs_->group().comm() : nullptr; }
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
  std::shared_ptr<RankProcess> procs_;  // ranks as processes; then comms_ and threads_ stay idle
  InProcessGroup comms_;
  std::vector<Engine> shards_;                     // [world]
  std::vector<std::unique_ptr<Backend>> backends_;  // [world]; rank 0 runs on the Model's own backend
  std::vector<std::unique_ptr<Model>> peers_;      // [world]; rank 0 is the owner
  RankThreads threads_;                            // last: joined before the Models go
};

}  // namespace ingot
