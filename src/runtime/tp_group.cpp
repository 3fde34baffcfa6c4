#include "runtime/tp_group.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "runtime/model.h"
#include "runtime/tp_split.h"

namespace ingot {

TpGroup::TpGroup(int world) : comms_(world), backends_(size_t(world)), peers_(size_t(world)), threads_(comms_) {}

TpGroup::~TpGroup() = default;

namespace {

void check_backend(const Backend& backend, int world) {
  if (!backend.host_memory())
    throw Error("--tp " + std::to_string(world) + ": tensor parallelism on the " + backend.name() +
                " backend is not implemented yet (NCCL is the next part); --device cpu runs it in-process");
}

// INGOT_TP_PROCESSES: "1" runs the ranks as processes, "0" or unset as threads.
bool processes_wanted() {
  const char* v = std::getenv("INGOT_TP_PROCESSES");
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw Error(std::string("INGOT_TP_PROCESSES=") + v + ": must be 1 (ranks as processes) or 0 (threads)");
}

}  // namespace

std::unique_ptr<TpGroup> TpGroup::make(const Engine& engine, const Backend& backend, const RuntimeOptions& options) {
  if (options.tp == 1) return nullptr;
  check_tensor_parallel(engine.spec, options.tp);
  check_backend(backend, options.tp);
  std::unique_ptr<TpGroup> g(new TpGroup(options.tp));
  if (processes_wanted()) {
    // Every process loaded the whole engine (it runs the same command) and slices its own rank out
    // of it: the same slice the thread group would give that rank, so the same bits.
    ProcessGroupOptions po;
    po.world = options.tp;
    g->procs_ = ProcessGroup::start(po);
    g->shards_.push_back(shard_engine(engine, options.tp, g->procs_->rank()));
    return g;
  }
  for (int r = 0; r < options.tp; ++r) g->shards_.push_back(shard_engine(engine, options.tp, r));
  return g;
}

std::unique_ptr<TpGroup> TpGroup::from_shards(const std::vector<Engine>& shards, const Backend& backend,
                                             const RuntimeOptions& options) {
  const int world = int(shards.size());
  if (processes_wanted())
    throw Error("INGOT_TP_PROCESSES=1 with an engine directory: loading one rank's file per process is not "
                "implemented yet; load the checkpoint (--model) or run the ranks as threads");
  if (options.tp != world)
    throw Error("--tp " + std::to_string(options.tp) + ": the engine is split over " + std::to_string(world) + " ranks");
  check_backend(backend, world);
  std::unique_ptr<TpGroup> g(new TpGroup(world));
  for (int r = 0; r < world; ++r) {
    const Engine& s = shards[size_t(r)];
    if (s.spec.tp.world != world || s.spec.tp.rank != r)
      throw Error("tensor parallel: the slice given as rank " + std::to_string(r) + " of " + std::to_string(world) +
                  " is rank " + std::to_string(s.spec.tp.rank) + " of " + std::to_string(s.spec.tp.world));
    Engine e;
    e.spec = s.spec;
    e.weight_dtype = s.weight_dtype;
    e.provenance = s.provenance;
    // Borrowed: the loader keeps the files' mappings (the shards) alive longer than the Model.
    for (const auto& [name, t] : s.weights)
      e.weights.emplace(name, HostTensor::borrow(t.dtype(), t.shape(), t.data(),
                                                 std::shared_ptr<const void>(t.data(), [](const void*) {})));
    g->shards_.push_back(std::move(e));
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
