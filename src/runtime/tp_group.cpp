#include "runtime/tp_group.h"

#include <algorithm>
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

}  // namespace

std::unique_ptr<TpGroup> TpGroup::make(const Engine& engine, const Backend& backend, const RuntimeOptions& options) {
  if (options.tp == 1) return nullptr;
  check_tensor_parallel(engine.spec, options.tp);
  check_backend(backend, options.tp);
  std::unique_ptr<TpGroup> g(new TpGroup(options.tp));
  for (int r = 0; r < options.tp; ++r) g->shards_.push_back(shard_engine(engine, options.tp, r));
  return g;
}

std::unique_ptr<TpGroup> TpGroup::from_shards(const std::vector<Engine>& shards, const Backend& backend,
                                             const RuntimeOptions& options) {
  const int world = int(shards.size());
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
  // The ranks share the machine's cores.
  const int threads = std::max(1, int(std::thread::hardware_concurrency()) / world());
  run([&](int r) {
    if (r == 0) return;
    backends_[size_t(r)] = make_cpu_backend(threads);
    peers_[size_t(r)].reset(new Model(shards_[size_t(r)], *backends_[size_t(r)], options, comm(r)));
  });
}

}  // namespace ingot
