#include "runtime/tp_group.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "runtime/model.h"
#include "runtime/tp_split.h"

namespace ingot {

TpGroup::TpGroup(int world) : comms_(world), backends_(size_t(world)), peers_(size_t(world)), threads_(comms_) {}

TpGroup::~TpGroup() = default;

std::unique_ptr<TpGroup> TpGroup::make(const Engine& engine, const Backend& backend, const RuntimeOptions& options) {
  if (options.tp == 1) return nullptr;
  check_tensor_parallel(engine.spec, options.tp);
  if (!backend.host_memory())
    throw Error("--tp " + std::to_string(options.tp) + ": tensor parallelism on the " + backend.name() +
                " backend is not implemented yet (NCCL is the next part); --device cpu runs it in-process");
  std::unique_ptr<TpGroup> g(new TpGroup(options.tp));
  for (int r = 0; r < options.tp; ++r) g->shards_.push_back(shard_engine(engine, options.tp, r));
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
