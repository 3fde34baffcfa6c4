// The all-reduce latency of tensor parallelism on the GPU (docs/tensor-parallel.md): ncclAllReduce
// through NcclCommunicator on the CUDA backend's stream, and the one-shot peer-to-peer all-reduce
// (dist/p2p_all_reduce.h), at the sizes a decode step reduces (a few rows of the hidden state in bf16:
// 8 to 64 KiB) and a few larger ones, issued one by one from the host ("eager") and replayed from a
// captured CUDA graph as the decode graph runs them ("graph"). SPMD like `ingot --tp N`: the
// process started is rank 0 and starts ranks 1..N-1 by exec'ing itself (dist/process_group.h), rank r on
// GPU r; rank 0 prints the table. Built only with CUDA and NCCL; not a google-benchmark program (the
// ranks must run the same iterations in step).
//
//   bench_nccl_allreduce [--world N] [--iters K]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"
#include "dist/p2p_all_reduce.h"
#include "dist/process_group.h"
#include "runtime/tp_group.h"

namespace {

using Clock = std::chrono::steady_clock;

int arg_int(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ingot;
  try {
    const int world = arg_int(argc, argv, "--world", 2);
    const int iters = arg_int(argc, argv, "--iters", 400);
    if (world < 2 || world > kMaxTensorParallel) throw Error("--world must be in [2, 64]");
    if (iters < 20 || iters % 20) throw Error("--iters must be a multiple of 20, at least 20");
    const int gpus = cuda_device_count();
    if (gpus < world)
      throw Error("--world " + std::to_string(world) + " needs " + std::to_string(world) + " GPUs; this machine has " +
                  std::to_string(gpus));
    std::unique_ptr<Backend> be = make_cuda_backend(DType::BF16, local_rank_from_environment() % gpus);
    ProcessGroupOptions po;
    po.world = world;
    std::shared_ptr<RankProcess> ranks = RankProcess::start(po, *be);
    Communicator& comm = ranks->comm();
    const int rank = comm.rank();

    // Correctness first: rank r contributes r + 1 everywhere; the sum is world (world + 1) / 2, exact.
    {
      const int64_t n = 4096;
      std::vector<float> host(size_t(n), float(rank + 1));
      Buffer b(*be, size_t(n) * sizeof(float));
      be->upload(b.get(), host.data(), b.size());
      comm.all_reduce_sum(b.get(), n, DType::F32);
      be->download(host.data(), b.get(), b.size());
      const float want = float(world * (world + 1) / 2);
      for (float v : host)
        if (v != want) throw Error("rank " + std::to_string(rank) + ": all-reduce gave " + std::to_string(v) +
                                   ", expected " + std::to_string(want));
    }

    // One implementation's eager and graph times per call at `kib` KiB of bf16.
    auto time = [&](size_t kib, const std::function<void(void*, int64_t)>& reduce) {
      const int64_t count = int64_t(kib * 1024 / 2);  // bf16 values
      Buffer b(*be, kib * 1024);
      be->fill_zero(b.get(), b.size());  // zeros stay zeros: the sums never overflow over the iterations
      for (int i = 0; i < 20; ++i) reduce(b.get(), count);
      comm.barrier();
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) reduce(b.get(), count);
      be->synchronize();
      const double eager = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
      // 20 all-reduces per graph, as a decode step of a 20-layer model issues back to back (without the
      // kernels between them).
      std::unique_ptr<Graph> g = be->capture([&] {
        for (int i = 0; i < 20; ++i) reduce(b.get(), count);
      });
      if (!g) throw Error("the CUDA backend did not capture a graph");
      g->replay();
      comm.barrier();
      t0 = Clock::now();
      for (int i = 0; i < iters / 20; ++i) g->replay();
      be->synchronize();
      const double graph = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
      return std::pair<double, double>(eager, graph);
    };
    constexpr size_t kP2pMaxKib = 1024;
    std::string why;
    std::unique_ptr<P2pAllReduce> p2p = P2pAllReduce::open(ranks->group().comm(), *be, kP2pMaxKib << 10, why);
    // Correctness of the peer-to-peer path as above.
    if (p2p) {
      const int64_t n = 4096;
      std::vector<float> host(size_t(n), float(rank + 1));
      Buffer b(*be, size_t(n) * sizeof(float));
      be->upload(b.get(), host.data(), b.size());
      p2p->all_reduce_sum(b.get(), n, DType::F32);
      be->download(host.data(), b.get(), b.size());
      for (float v : host)
        if (v != float(world * (world + 1) / 2))
          throw Error("rank " + std::to_string(rank) + ": the p2p all-reduce gave " + std::to_string(v));
    }
    struct Row {
      size_t kib;
      std::pair<double, double> nccl, p2p;
    };
    std::vector<Row> rows;
    for (size_t kib : {8, 16, 32, 64, 256, 1024}) {
      Row r{kib, time(kib, [&](void* buf, int64_t count) { comm.all_reduce_sum(buf, count, DType::BF16); }), {0, 0}};
      if (p2p) r.p2p = time(kib, [&](void* buf, int64_t count) { p2p->all_reduce_sum(buf, count, DType::BF16); });
      rows.push_back(r);
    }
    comm.barrier();
    if (rank == 0) {
      const int v = NcclCommunicator::version();
      std::printf("nccl %d.%d.%d, %d ranks (one process per GPU), bf16 all-reduce, %d iterations, rank 0's times\n",
                  v / 10000, (v / 100) % 100, v % 100, world, iters);
      if (!p2p) std::printf("no p2p all-reduce: %s\n", why.c_str());
      std::printf("%8s %14s %14s %14s %14s\n", "KiB", "nccl eager us", "nccl graph us", "p2p eager us", "p2p graph us");
      for (const Row& r : rows)
        std::printf("%8zu %14.2f %14.2f %14.2f %14.2f\n", r.kib, r.nccl.first, r.nccl.second, r.p2p.first, r.p2p.second);
    }
    p2p.reset();
    ranks.reset();  // the group closes (workers told to finish) before the backend goes
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nccl_allreduce: %s\n", e.what());
    return 1;
  }
}
