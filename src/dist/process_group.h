// A tensor-parallel group whose ranks are processes on one host (docs/tensor-parallel.md, "Ranks as
// processes"): the process the user started is rank 0 and starts ranks 1..N-1 itself by exec'ing its
// own executable (/proc/self/exe) with the same command line and INGOT_TP_WORKER in the environment;
// or, under `mpirun -np N`, every rank is started by mpirun and takes its rank and world from the MPI
// environment, the ranks meeting in the directory INGOT_TP_RENDEZVOUS names. Either way every process
// runs the same program (SPMD) and calls ProcessGroup::start at the same point.
//
// The workers connect to rank 0 over a Unix-domain socket and introduce themselves (protocol version,
// world, rank, a random session token); rank 0 refuses anything else. Collectives go through rank 0
// (each worker sends its buffer, rank 0 reduces or assembles with the in-process group's code and sends
// the result back), which is all the CPU backend needs and gives bitwise the in-process results. A rank
// that ends (exit, crash, kill -9) stops every other rank with an error naming it and how it ended.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/in_process.h"  // GroupStopped
#include "dist/process_io.h"

namespace ingot {

// The environment variables of the process group.
inline constexpr const char* kTpWorkerEnv = "INGOT_TP_WORKER";          // set by rank 0 for the workers it starts
inline constexpr const char* kTpRendezvousEnv = "INGOT_TP_RENDEZVOUS";  // mpirun mode: where the ranks meet

struct ProcessGroupOptions {
  int world = 2;  // the ranks wanted (--tp N); under mpirun it must equal the MPI world size
  // What rank 0 execs for ranks 1..N-1: empty exe is this executable (/proc/self/exe), empty argv this
  // process's own command line (argv[0] included), so a worker runs the command the user typed.
  std::string exe;
  std::vector<std::string> argv;
  bool silence_worker_stdout = true;  // workers' standard output discarded (rank 0 prints the results)
  // How long rank 0 waits for every rank to join, and a worker for rank 0 to appear (mpirun mode).
  std::chrono::milliseconds join_timeout{60000};
};

// This process's index among the ranks of its host, from the environment alone (before any group is
// started), for picking its GPU (one process per GPU, rank r on GPU r): a worker rank 0 started takes
// the rank in INGOT_TP_WORKER; under mpirun the launcher's node-local rank when it gives one
// (Open MPI: OMPI_COMM_WORLD_LOCAL_RANK, else LOCAL_RANK, else OMPI_COMM_WORLD_RANK; MPICH/Hydra:
// MPI_LOCALRANKID, else LOCAL_RANK, else PMI_RANK); otherwise (the process the user started) 0. A value that is not a whole
// number >= 0 is refused naming the variable. ProcessGroup::start checks the rest of the environment.
int local_rank_from_environment();
// This process's rank in a group of `world` processes, from the environment alone, before the group
// is started (so that a rank can build or load only its own slice of the weights first): the rank in
// INGOT_TP_WORKER for a worker rank 0 started, OMPI_COMM_WORLD_RANK or PMI_RANK under mpirun, else 0
// (the process the user started, which starts the others). A rank outside [0, world) is refused
// naming the variable; ProcessGroup::start reads the same variables, checks the rest and gets the
// same rank.
int tp_rank_from_environment(int world);

class ProcessGroup {
 public:
  // Rank 0 (starting the workers), a started worker (INGOT_TP_WORKER set) or an mpirun rank
  // (OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE set), by the environment; returns once every rank
  // has joined. Throws Error naming the problem: a bad world size, a malformed or contradictory
  // environment, a rendezvous directory that is missing or not private, a rank that ended or did not
  // join in time. The caller's thread must outlive the group: workers die with it (PR_SET_PDEATHSIG).
  static std::unique_ptr<ProcessGroup> start(const ProcessGroupOptions& options);
  // Without close(): tells the others, waits a little for the workers rank 0 started, kills the rest.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  Communicator& comm();
  // Rank 0 that started its workers: their pids, ranks 1..N-1 in order (empty otherwise).
  std::vector<pid_t> worker_pids() const;

  struct Ended {
    int rank = 0;
    pid_t pid = 0;
    std::string how;  // "exited with code 0", "was killed by signal 9 (Killed)", "did not exit ..."
    bool clean = false;  // exited with code 0
  };
  // The orderly end. Rank 0 tells every worker (unless the group broke), then waits up to `timeout` for
  // the workers it started, killing those still running, and returns how each ended. A worker waits
  // for rank 0's word and returns nothing. Later collectives throw.
  std::vector<Ended> close(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // For a rank that may block where the group cannot see (inside an NCCL collective on the GPU, whose
  // kernel waits for a peer that died): calls on_lost(reason) once, from a thread of its own, when a
  // peer's connection ends while the watch runs (rank 0 watches every worker, an mpirun worker rank 0),
  // so the caller can abort what waits. It only polls the sockets for their end (no byte is read). Ended by
  // unwatch(), which the orderly close() needs first (peers then leave on purpose), and by the destructor.
  // A worker that rank 0 started watches nothing: it is killed when rank 0 ends (PR_SET_PDEATHSIG),
  // and so never sees rank 0's socket close at an orderly end while it still finishes its own work.
  void watch(std::function<void(const std::string&)> on_lost);
  void unwatch();

 private:
  class Comm;
  struct Collective;
  ProcessGroup(int rank, int world);
  // fn (one of the three ways to start) with the group marked stopped, and the joined workers told, when it throws.
  void guarded_start(const std::function<void()>& fn);
  void launch(const ProcessGroupOptions& options);
  void join_as_worker(const std::string& spec, const ProcessGroupOptions& options);
  void meet_under_mpi(int rank, const ProcessGroupOptions& options, const std::string& rank_var);
  // Rank 0: accepts and checks the workers' introductions until every rank joined.
  void accept_workers(int listen_fd, const std::string& token, std::chrono::milliseconds timeout, const std::string& where);
  // A worker: connects to path and introduces itself; retry: keep trying (mpirun mode) until the deadline.
  void connect_to_root(const std::string& path, const std::string& token_or_file, bool token_is_file,
                       std::chrono::milliseconds timeout);
  // Collectives.
  void run_collective(Collective& c);
  void root_collective(Collective& c);
  void worker_collective(Collective& c);
  [[noreturn]] void rank_lost(int rank, const std::string& what);
  [[noreturn]] void stop(const std::string& reason);  // records the reason, tells the other ranks, throws
  void tell_workers_stopped();  // rank 0: sends broken_ to every connected worker
  void check_usable() const;

  int rank_, world_;
  uint64_t seq_ = 0;
  std::string broken_;  // why the group stopped; empty while usable
  bool closed_ = false;
  bool dies_with_rank0_ = false;  // a worker rank 0 started (it dies with rank 0)
  std::vector<proc::Fd> peers_;        // rank 0: [world] the workers' sockets (0 empty); a worker: [1] rank 0's
  std::vector<pid_t> peer_pids_;       // [world] (rank 0: each worker's pid from the socket; a worker: [0] rank 0's)
  std::vector<proc::Child> children_;  // rank 0 that started its workers: [world] (0 empty)
  std::vector<std::vector<uint8_t>> scratch_;  // rank 0: [world] the workers' contributions
  std::vector<float> sum_, widened_;
  std::unique_ptr<Comm> comm_;
  struct Watch;
  std::unique_ptr<Watch> watch_;
};

}  // namespace ingot
