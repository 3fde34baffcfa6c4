// P2pAllReduce (dist/p2p_all_reduce.h): the staging memory every rank exports, the peers' memory each
// rank imports (CUDA IPC), and the call into the kernel (backend/cuda/p2p_reduce.h).
#include "dist/p2p_all_reduce.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/p2p_reduce.h"
#include "core/error.h"
#include "dist/watchdog.h"

namespace ingot {

namespace {

std::string rank_text(int rank, int world) { return "rank " + std::to_string(rank) + " of " + std::to_string(world); }

void cuda_check(cudaError_t e, const std::string& who, const char* call) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw Error(who + ": " + call + " failed: " + cudaGetErrorString(e));
}

// One byte from every rank: true when all of them sent 1.
bool all_agree(Communicator& host, bool mine) {
  std::vector<uint8_t> all(size_t(host.world()), 0);
  all[size_t(host.rank())] = mine ? 1 : 0;
  host.all_gather(all.data() + host.rank(), all.data(), 1);
  for (uint8_t v : all)
    if (!v) return false;
  return true;
}

}  // namespace

struct P2pAllReduce::Impl {
  int rank = 0, world = 1, device = 0;
  uint64_t timeout_ns = 0;
  cudaStream_t stream = nullptr;
  size_t max_bytes = 0, slot_bytes = 0, staging_bytes = 0;
  void* local = nullptr;      // exported: [2, world, slot_bytes] staging, then [kP2pBlocks, world] uint32 flags
  uint32_t* calls = nullptr;  // [kP2pBlocks] not exported
  int* host_words = nullptr;      // host-mapped [2]: a timeout's rank, abort() (p2p_reduce.h)
  int* host_words_dev = nullptr;  // the same, as the kernel addresses it
  std::vector<void*> opened;  // [world] the peers' exports as mapped here (null at this rank)

  ~Impl() {
    // Nothing of ours may be in flight when the memory goes: the stream first (its result ignored, a
    // destructor reports nothing), then the peers' mappings, then our own memory.
    if (stream) cudaStreamSynchronize(stream);
    for (void* p : opened)
      if (p) cudaIpcCloseMemHandle(p);
    if (local) cudaFree(local);
    if (calls) cudaFree(calls);
    if (host_words) cudaFreeHost(host_words);
    cudaGetLastError();  // a failure above is not the next CUDA call's
  }

  uint8_t* staging(int r) const { return static_cast<uint8_t*>(r == rank ? local : opened[size_t(r)]); }
  uint32_t* flags(int r) const { return reinterpret_cast<uint32_t*>(staging(r) + staging_bytes); }
};

P2pAllReduce::P2pAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
P2pAllReduce::~P2pAllReduce() = default;

std::unique_ptr<P2pAllReduce> P2pAllReduce::open(Communicator& host, Backend& backend, size_t max_bytes,
                                                 std::string& why) {
  const int rank = host.rank(), world = host.world();
  const std::string who = "p2p all-reduce, " + rank_text(rank, world);
  if (world < 2 || world > cuda::kP2pMaxRanks) {
    why = who + ": it serves 2.." + std::to_string(cuda::kP2pMaxRanks) + " ranks";
    return nullptr;
  }
  if (max_bytes == 0 || max_bytes > (size_t(64) << 20))
    throw Error(who + ": its largest sum must be in [1, 64 MiB] bytes, not " + std::to_string(max_bytes));
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->world = world;
  impl->device = backend.device_ordinal();
  impl->stream = static_cast<cudaStream_t>(backend.native_stream());
  if (!impl->stream || impl->device < 0) throw Error(who + ": the " + backend.name() + " backend has no CUDA stream");
  // How long a block waits for a peer before it stops the kernel (INGOT_TP_TIMEOUT_S).
  impl->timeout_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(tp_timeout_from_env()).count());
  cuda_check(cudaSetDevice(impl->device), who, "cudaSetDevice");

  // Every rank's GPU by PCI bus id (ordinals differ between processes that see different devices),
  // then whether this GPU reaches each peer's.
  constexpr size_t kBusId = 32;
  std::vector<char> ids(size_t(world) * kBusId, 0);
  cuda_check(cudaDeviceGetPCIBusId(ids.data() + size_t(rank) * kBusId, int(kBusId), impl->device), who,
             "cudaDeviceGetPCIBusId");
  host.all_gather(ids.data() + size_t(rank) * kBusId, ids.data(), kBusId);
  std::string mine_why;
  for (int q = 0; q < world && mine_why.empty(); ++q) {
    if (q == rank) continue;
    const std::string bus(ids.data() + size_t(q) * kBusId, strnlen(ids.data() + size_t(q) * kBusId, kBusId));
    int dev = -1, can = 0;
    if (cudaDeviceGetByPCIBusId(&dev, bus.c_str()) != cudaSuccess) {
      cudaGetLastError();
      mine_why = "rank " + std::to_string(q) + "'s GPU " + bus + " is not visible to " + rank_text(rank, world);
    } else if (dev == impl->device) {
      mine_why = "ranks " + std::to_string(rank) + " and " + std::to_string(q) + " share GPU " + bus;
    } else if (cudaDeviceCanAccessPeer(&can, impl->device, dev) != cudaSuccess || !can) {
      cudaGetLastError();
      mine_why = "GPU " + std::to_string(impl->device) + " cannot access GPU " + bus + " (rank " + std::to_string(q) +
                 ") peer to peer";
    }
  }
  if (!all_agree(host, mine_why.empty())) {
    why = mine_why.empty() ? who + ": another rank's GPU has no peer-to-peer path" : who + ": " + mine_why;
    return nullptr;
  }

  // This rank's memory, zeroed (the flags and call counts start at call 0 everywhere), exported.
  impl->max_bytes = max_bytes;
  impl->slot_bytes = (max_bytes + 15) / 16 * 16;
  impl->staging_bytes = 2 * size_t(world) * impl->slot_bytes;
  const size_t flag_bytes = size_t(cuda::kP2pBlocks) * size_t(world) * sizeof(uint32_t);
  cuda_check(cudaMalloc(&impl->local, impl->staging_bytes + flag_bytes), who, "cudaMalloc (staging)");
  cuda_check(cudaMalloc(reinterpret_cast<void**>(&impl->calls), cuda::kP2pBlocks * sizeof(uint32_t)), who,
             "cudaMalloc (calls)");
  // [0]: 1 + the rank a timed-out block waited for; [1]: set by abort() for the kernel to see.
  cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&impl->host_words), 2 * sizeof(int), cudaHostAllocMapped), who,
             "cudaHostAlloc");
  impl->host_words[0] = impl->host_words[1] = 0;
  cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl->host_words_dev), impl->host_words, 0), who,
             "cudaHostGetDevicePointer");
  cuda_check(cudaMemset(impl->local, 0, impl->staging_bytes + flag_bytes), who, "cudaMemset");
  cuda_check(cudaMemset(impl->calls, 0, cuda::kP2pBlocks * sizeof(uint32_t)), who, "cudaMemset");
  cuda_check(cudaDeviceSynchronize(), who, "cudaDeviceSynchronize");
  std::vector<uint8_t> handles(size_t(world) * sizeof(cudaIpcMemHandle_t));
  cudaIpcMemHandle_t h;
  cuda_check(cudaIpcGetMemHandle(&h, impl->local), who, "cudaIpcGetMemHandle");
  std::memcpy(handles.data() + size_t(rank) * sizeof h, &h, sizeof h);
  host.all_gather(handles.data() + size_t(rank) * sizeof h, handles.data(), sizeof h);
  impl->opened.assign(size_t(world), nullptr);
  std::string open_why;
  for (int q = 0; q < world && open_why.empty(); ++q) {
    if (q == rank) continue;
    std::memcpy(&h, handles.data() + size_t(q) * sizeof h, sizeof h);
    const cudaError_t e = cudaIpcOpenMemHandle(&impl->opened[size_t(q)], h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      impl->opened[size_t(q)] = nullptr;
      open_why = "cudaIpcOpenMemHandle of rank " + std::to_string(q) + "'s memory failed: " + cudaGetErrorString(e);
    }
  }
  // Also the barrier after which peers may write here: every rank's memory is zeroed by now.
  if (!all_agree(host, open_why.empty())) {
    why = who + ": " + (open_why.empty() ? "another rank could not map its peers' memory" : open_why);
    return nullptr;
  }
  return std::unique_ptr<P2pAllReduce>(new P2pAllReduce(std::move(impl)));
}

size_t P2pAllReduce::max_bytes() const { return impl_->max_bytes; }

void P2pAllReduce::all_reduce_sum(void* buf, int64_t count, DType dtype) {
  cuda::P2pReduceParams p;
  p.buf = buf;
  p.count = count;
  p.rank = impl_->rank;
  p.world = impl_->world;
  for (int r = 0; r < impl_->world; ++r) {
    p.staging[r] = impl_->staging(r);
    p.flags[r] = impl_->flags(r);
  }
  p.calls = impl_->calls;
  p.slot_bytes = int64_t(impl_->slot_bytes);
  p.timeout_ns = impl_->timeout_ns;
  p.host_words = impl_->host_words_dev;
  cuda::p2p_reduce_sum(p, dtype, impl_->stream);
}

void P2pAllReduce::abort() { reinterpret_cast<volatile int*>(impl_->host_words)[1] = 1; }

int P2pAllReduce::timed_out_on() const {
  const int v = *reinterpret_cast<volatile int*>(impl_->host_words);
  return v > 0 ? v - 1 : -1;
}

}  // namespace ingot
