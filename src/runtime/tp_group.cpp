#include "runtime/tp_group.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#ifdef INGOT_WITH_NCCL
#include "dist/nccl_communicator.h"
#endif
#include "runtime/model.h"
#include "runtime/tp_split.h"

namespace ingot {

TpGroup::TpGroup(int world) : comms_(world), backends_(size_t(world)), peers_(size_t(world)), threads_(comms_) {}

TpGroup::~TpGroup() = default;

namespace {

// On the GPU the ranks are processes with NCCL between them, which a CUDA build has only when it found
// NCCL at configure time.
void check_backend(const Backend& backend, int world) {
#ifdef INGOT_WITH_NCCL
  (void)backend, (void)world;
#else
  if (!backend.host_memory())
    throw Error("--tp " + std::to_string(world) + " --device " + backend.name() + ": this build of ingot has no NCCL "
                "(libnccl and nccl.h were not found at configure time), which tensor parallelism on the GPU needs; "
                "--device cpu runs it");
#endif
}

}  // namespace

bool tp_ranks_are_processes(bool gpu) {
  const char* v = std::getenv("INGOT_TP_PROCESSES");
  const std::string s = v ? v : "";
  if (!s.empty() && s != "0" && s != "1")
    throw Error("INGOT_TP_PROCESSES=" + s + ": must be 1 (ranks as processes) or 0 (threads)");
  if (gpu) {
    if (s == "0")
      throw Error("INGOT_TP_PROCESSES=0 asks for ranks as threads, but on the GPU the ranks are processes, one "
                  "per GPU; unset it (or set 1)");
    return true;
  }
  return s == "1";
}

std::shared_ptr<RankProcess> RankProcess::start(const ProcessGroupOptions& options, Backend& backend) {
  std::shared_ptr<RankProcess> p(new RankProcess());
  p->group_ = ProcessGroup::start(options);
  if (backend.native_stream()) {
#ifdef INGOT_WITH_NCCL
    auto nccl = std::make_unique<NcclCommunicator>(p->group_->comm(), backend);
    // A peer that dies while this rank waits inside an NCCL collective would leave its kernel waiting
    // for ever: the group's watch sees the peer's socket close and aborts NCCL, which ends the wait
    // with an error naming the rank.
    NcclCommunicator* raw = nccl.get();
    p->group_->watch([raw](const std::string& why) { raw->abort_from_watch(why); });
    p->device_ = std::move(nccl);
#else
    throw Error("tensor parallelism on the " + backend.name() + " backend needs NCCL, which this build does not have");
#endif
  }
  return p;
}

std::shared_ptr<RankProcess> RankProcess::start(int world, Backend& backend) {
  ProcessGroupOptions po;
  po.world = world;
  // Each process builds (or, for bench, generates) its rank's slice of the model before it joins,
  // which for a checkpoint of billions of weights takes longer than the group's default minute; a
  // worker that ends is still noticed at once, so only a hung one waits this long.
  po.join_timeout = std::chrono::minutes(10);
  return start(po, backend);
}

RankProcess::~RankProcess() {
  if (group_) group_->unwatch();  // its callback reaches device_, which goes first
}

std::vector<ProcessGroup::Ended> RankProcess::close(std::chrono::milliseconds timeout) {
  group_->unwatch();  // the peers leave on purpose from here
  device_.reset();
  return group_->close(timeout);
}

std::unique_ptr<TpGroup> TpGroup::make(const Engine& engine, Backend& backend, const RuntimeOptions& options,
                                       std::shared_ptr<RankProcess> ranks) {
  if (options.tp == 1) return nullptr;
  check_tensor_parallel(engine.spec, options.tp);
  const bool processes = ranks || tp_ranks_are_processes(!backend.host_memory());
  check_backend(backend, options.tp);
  std::unique_ptr<TpGroup> g(new TpGroup(options.tp));
  if (processes) {
    // This process holds the whole engine (an engine file, or a caller's Engine; the loader instead
    // builds each process's slice alone and comes through from_shards) and slices its own rank out of
    // it: the same slice the thread group would give that rank, so the same bits.
    if (!ranks) ranks = RankProcess::start(options.tp, backend);
    if (ranks->world() != options.tp)
      throw Error("--tp " + std::to_string(options.tp) + ": the process group has " + std::to_string(ranks->world()) +
                  " ranks");
    g->procs_ = std::move(ranks);
    g->shards_.push_back(shard_engine(engine, options.tp, g->procs_->rank()));
    return g;
  }
  for (int r = 0; r < options.tp; ++r) g->shards_.push_back(shard_engine(engine, options.tp, r));
  return g;
}

std::unique_ptr<TpGroup> TpGroup::from_shards(const std::vector<Engine>& shards, Backend& backend,
                                             const RuntimeOptions& options, std::shared_ptr<RankProcess> ranks) {
  // Ranks as processes: over the RankProcess given (the loader's), else one started here.
  if (ranks || tp_ranks_are_processes(!backend.host_memory())) {
    check_backend(backend, options.tp);
    if (!ranks) ranks = RankProcess::start(options.tp, backend);
    // This process's slice: the one it built or loaded alone (runtime/loader.h), or its rank's of all.
    if (shards.size() != 1 && int(shards.size()) != options.tp)
      throw Error("--tp " + std::to_string(options.tp) + ": a rank process takes its own slice or every rank's, not " +
                  std::to_string(shards.size()));
    const Engine& s = shards.size() == 1 ? shards[0] : shards[size_t(ranks->rank())];
    if (ranks->world() != options.tp || s.spec.tp.world != options.tp || s.spec.tp.rank != ranks->rank())
      throw Error("tensor parallel: this process is rank " + std::to_string(ranks->rank()) + " of " +
                  std::to_string(ranks->world()) + " but holds the slice of rank " + std::to_string(s.spec.tp.rank) +
                  " of " + std::to_string(s.spec.tp.world) + " (--tp " + std::to_string(options.tp) + ")");
    std::unique_ptr<TpGroup> g(new TpGroup(options.tp));
    g->procs_ = std::move(ranks);
    g->shards_.push_back(borrowed_engine(s));  // the loader keeps the slices alive longer
    return g;
  }
  // Threads (the CPU only: on the GPU the ranks are always processes, above).
  const int world = int(shards.size());
  if (options.tp != world)
    throw Error("--tp " + std::to_string(options.tp) + ": the engine is split over " + std::to_string(world) + " ranks");
  std::unique_ptr<TpGroup> g(new TpGroup(world));
  for (int r = 0; r < world; ++r) {
    const Engine& s = shards[size_t(r)];
    if (s.spec.tp.world != world || s.spec.tp.rank != r)
      throw Error("tensor parallel: the slice given as rank " + std::to_string(r) + " of " + std::to_string(world) +
                  " is rank " + std::to_string(s.spec.tp.rank) + " of " + std::to_string(s.spec.tp.world));
    g->shards_.push_back(borrowed_engine(s));
  }
  return g;
}

void TpGroup::start_peers(const RuntimeOptions& options) {
  if (procs_) return;  // the other ranks are the other processes
  // The ranks share the machine's cores.
  const int threads = std::max(1, int(std::thread::hardware_concurrency()) / world());
  run([&](int r) {
    if (r == 0) return;
    backends_[size_t(r)] = make_cpu_backend(threads);
    peers_[size_t(r)].reset(new Model(shards_[size_t(r)], *backends_[size_t(r)], options, comm(r)));
  });
}

}  // namespace ingot
