// NcclCommunicator (dist/nccl_communicator.h): the NCCL handle, its bootstrap over the host
// communicator, and the collectives on the CUDA backend's stream.
#include "dist/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/in_process.h"  // GroupStopped
#include "dist/p2p_all_reduce.h"
#include "dist/watchdog.h"

namespace ingot {

namespace {

std::string rank_text(int rank, int world) { return "NCCL rank " + std::to_string(rank) + " of " + std::to_string(world); }

// Sums of at most this many bytes go to the one-shot peer-to-peer all-reduce (dist/p2p_all_reduce.h),
// larger ones to NCCL: INGOT_TP_P2P_BYTES, read when the communicator is made. 0 (the default until a
// GPU run has measured and checked it) leaves every sum to NCCL.
size_t p2p_bytes_from_env() {
  const char* e = std::getenv("INGOT_TP_P2P_BYTES");
  if (!e || !*e) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  if (*end != '\0' || v < 0 || v > (64ll << 20))
    throw Error("INGOT_TP_P2P_BYTES=" + std::string(e) + " is not a byte count in [0, 67108864]");
  return size_t(v);
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    default: break;
  }
  throw Error("all_reduce_sum: dtype " + std::string(dtype_name(dt)) + " is not supported (f32, f16 or bf16)");
}

}  // namespace

// The handle and what it runs on. Owning the ncclComm_t here (not in the header) keeps nccl.h out of
// every file that includes the communicator.
struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  bool failed = false;
  std::atomic<bool> aborted{false};  // by abort_from_watch: comm is gone
  mutable std::mutex why_mu;
  std::string why;
  std::unique_ptr<P2pAllReduce> p2p;  // null: every sum through NCCL
  std::unique_ptr<Watchdog> watchdog;  // the deadline on waits for this rank's collectives
  int uncaught_at_start = std::uncaught_exceptions();

  // Every NCCL result goes through here: an Error naming the call, NCCL's text for the code and, when
  // the communicator exists, its last error message (which says which peer or transport failed).
  void check(ncclResult_t r, const char* call, const std::string& who) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    failed = true;
    std::string msg = who + ": " + call + " failed: " + ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm);  // null comm: the last error of this thread
    if (last && *last) msg += " (" + std::string(last) + ")";
    throw Error(msg);
  }

  ~Impl() {
    p2p.reset();
    if (!comm || aborted) return;
    // Destroy flushes what is queued and may wait on the peers; after a failure, or while an exception
    // unwinds (a peer may have died), abort instead: it frees the local side without waiting.
    if (failed || std::uncaught_exceptions() > uncaught_at_start) ncclCommAbort(comm);
    else ncclCommDestroy(comm);  // a destructor reports nothing; the handle is gone either way
  }
};

NcclCommunicator::NcclCommunicator(Communicator& host, Backend& backend)
    : impl_(std::make_unique<Impl>()), host_(host), rank_(host.rank()), world_(host.world()) {
  const std::string who = rank_text(rank_, world_);
  const size_t p2p_bytes = p2p_bytes_from_env();  // bad values are refused before any NCCL work
  const std::chrono::seconds limit = tp_timeout_from_env();
  impl_->stream = static_cast<cudaStream_t>(backend.native_stream());
  impl_->device = backend.device_ordinal();
  if (!impl_->stream || impl_->device < 0)
    throw Error(who + ": the " + backend.name() + " backend has no CUDA stream; NCCL needs the CUDA backend");
  // NCCL binds a communicator to the device current on the calling thread at init.
  if (cudaSetDevice(impl_->device) != cudaSuccess) {
    cudaGetLastError();
    throw Error(who + ": cudaSetDevice(" + std::to_string(impl_->device) + ") failed");
  }
  // The id: rank 0's, to every rank through the host communicator (an all-gather of 128-byte pieces,
  // of which only rank 0's is used). A rank's ncclGetUniqueId result is checked before the collective,
  // so a failure there stops that rank with NCCL's message and the others with the group's.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank_ == 0) impl_->check(ncclGetUniqueId(&id), "ncclGetUniqueId", who);
  std::vector<uint8_t> ids(size_t(world_) * sizeof id);
  std::memcpy(ids.data() + size_t(rank_) * sizeof id, &id, sizeof id);
  host.all_gather(ids.data() + size_t(rank_) * sizeof id, ids.data(), sizeof id);
  std::memcpy(&id, ids.data(), sizeof id);
  impl_->check(ncclCommInitRank(&impl_->comm, world_, id, rank_), "ncclCommInitRank", who);

  // A first collective of each kind outside any graph capture: NCCL connects its peers lazily, at the
  // first collective that needs a connection, and that setup (allocations, handshakes) is better done
  // here, eagerly, than while the first decode step is being captured. Sizes span the decode
  // (a few KiB per row) to prefill (MiB) so the protocols both use have been set up.
  for (size_t bytes : {size_t(8) << 10, size_t(256) << 10, size_t(4) << 20}) {
    Buffer b(backend, bytes * size_t(world_));
    backend.fill_zero(b.get(), b.size());
    all_reduce_sum(b.get(), int64_t(bytes / sizeof(float)), DType::F32);
    all_gather(b.as<uint8_t>() + size_t(rank_) * bytes, b.get(), bytes);
    backend.synchronize();
  }
  impl_->watchdog = std::make_unique<Watchdog>(limit, [this, who, limit](int64_t waited_s) {
    abort_from_watch(who + ": waited " + std::to_string(waited_s) + " s for a step's collectives (INGOT_TP_TIMEOUT_S=" +
                     std::to_string(limit.count()) + "): a peer rank is alive but did not take part");
  });
  if (p2p_bytes > 0) {
    std::string why;
    impl_->p2p = P2pAllReduce::open(host, backend, p2p_bytes, why);
    if (!impl_->p2p) std::fprintf(stderr, "ingot: %s; every all-reduce goes through NCCL\n", why.c_str());
  }
}

// The watchdog's thread calls back into this object: it is joined before anything else goes.
NcclCommunicator::~NcclCommunicator() { impl_->watchdog.reset(); }

Watchdog* NcclCommunicator::wait_watchdog() { return impl_->watchdog.get(); }

void NcclCommunicator::abort_from_watch(const std::string& why) {
  {
    std::lock_guard<std::mutex> l(impl_->why_mu);
    impl_->why = why;
  }
  if (impl_->p2p) impl_->p2p->abort();
  if (!impl_->aborted.exchange(true) && impl_->comm) ncclCommAbort(impl_->comm);
}

void NcclCommunicator::check_usable() const {
  if (!impl_->aborted) return;
  std::lock_guard<std::mutex> l(impl_->why_mu);
  throw GroupStopped(impl_->why + "; the group stopped");
}

void NcclCommunicator::all_reduce_sum(void* buf, int64_t count, DType dtype) {
  check_usable();
  const ncclDataType_t t = nccl_type(dtype);
  if (count < 0) throw Error("all_reduce_sum: negative count " + std::to_string(count));
  if (count == 0) return;
  if (impl_->p2p && size_t(count) * dtype_size(dtype) <= impl_->p2p->max_bytes())
    return impl_->p2p->all_reduce_sum(buf, count, dtype);
  impl_->check(ncclAllReduce(buf, buf, size_t(count), t, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce",
               rank_text(rank_, world_));
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  check_usable();
  if (bytes == 0) return;
  // NCCL takes send == recv + rank * bytes as in place, the Communicator contract's in-place case.
  impl_->check(ncclAllGather(send, recv, bytes, ncclUint8, impl_->comm, impl_->stream), "ncclAllGather",
               rank_text(rank_, world_));
}

void NcclCommunicator::barrier() {
  check_usable();
  // What was queued on this rank finishes first, so that passing the barrier means the collectives
  // before it are done here; then the ranks meet on the host.
  cudaError_t synced = cudaSuccess;
  {
    const Watchdog::Wait wait(impl_->watchdog.get());
    synced = cudaStreamSynchronize(impl_->stream);
  }
  if (synced != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    impl_->failed = true;
    std::string msg = rank_text(rank_, world_) + ": barrier: cudaStreamSynchronize failed: " + cudaGetErrorString(e);
    if (impl_->p2p && impl_->p2p->timed_out_on() >= 0)
      msg += " (the peer-to-peer all-reduce waited past INGOT_TP_TIMEOUT_S for rank " +
             std::to_string(impl_->p2p->timed_out_on()) + ")";
    throw Error(msg);
  }
  check_usable();  // a peer that died during the wait aborted NCCL: what finished is not a sum
  ncclResult_t async = ncclSuccess;
  impl_->check(ncclCommGetAsyncError(impl_->comm, &async), "ncclCommGetAsyncError", rank_text(rank_, world_));
  impl_->check(async, "a collective before the barrier", rank_text(rank_, world_));
  host_.barrier();
}

void NcclCommunicator::abort() { impl_->failed = true; }

std::string NcclCommunicator::describe() const {
  const int v = version();
  const std::string nccl =
      "nccl " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
  if (!impl_->p2p) return nccl;
  return "p2p one-shot up to " + std::to_string(impl_->p2p->max_bytes()) + " bytes, " + nccl + " above";
}

int NcclCommunicator::version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
}

}  // namespace ingot
