// The Communicator over NCCL: one process per GPU (docs/tensor-parallel.md, "On the GPU"). Compiled
// only in a CUDA build that found NCCL (INGOT_WITH_NCCL); the header itself needs neither, so code that
// only holds a Communicator& does not include nccl.h.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and the 128-byte id reaches every rank through the host
// communicator the processes already share (the process group's, dist/process_group.h): an all-gather
// of 128-byte host buffers, every rank keeping rank 0's piece. No other channel or protocol.
//
// The collectives are enqueued on the backend's stream (Backend::native_stream), so they run in order
// with the kernels around them, return to the host at once (the result is ready when the stream gets
// there, as for any kernel), and are recorded by Backend::capture into the decode graph like any
// kernel (NCCL supports stream capture since 2.9).
//
// Reduction order (what the Communicator contract's "rank order" becomes here): with 2 ranks NCCL's
// algorithms (ring, tree) compute a + b, one addition rounded once in the buffer's dtype, and addition
// is commutative, so both ranks hold bitwise the same sum, equal to the in-process group's rank-order
// sum: for f32 directly; for 16-bit buffers the in-process group adds in f32 and rounds once to 16 bits,
// and f32's 24 significand bits are at least 2p + 2 for the 16-bit types (p = 8 for bf16, 11 for f16),
// which makes that double rounding of a sum the correctly rounded 16-bit sum, as one 16-bit addition
// gives. (NVLink SHARP, NCCL_NVLS_ENABLE, where the
// switch adds, is not covered by this; the machines this was written for keep it off.) With
// more ranks NCCL's ring or tree adds in an order fixed for a given communicator, size and algorithm
// choice, and every rank receives the same reduced bits, but that order is not rank 0 + rank 1 + ...,
// so the sum may differ in the last bits from the in-process group's (and 16-bit partial sums are
// rounded at each step). Nothing more is claimed.
//
// Sums of at most INGOT_TP_P2P_BYTES bytes (default 0: none) go instead to the one-shot all-reduce over
// peer-to-peer memory (dist/p2p_all_reduce.h), which adds in rank order at any world size.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "dist/communicator.h"

namespace ingot {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `host` (every rank calls it at the same point): the id from rank 0, then
  // ncclCommInitRank on backend's GPU. `backend` is a CUDA backend (its stream and device); it must
  // outlive this communicator. Throws Error naming the NCCL call and NCCL's own message.
  NcclCommunicator(Communicator& host, Backend& backend);
  // ncclCommDestroy after a clean run; ncclCommAbort when a collective failed or an exception is
  // unwinding (a peer may be gone, and Destroy would wait for it).
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  // ncclAllReduce with ncclSum, in place, on the backend's stream (f32, f16, bf16); or the
  // peer-to-peer one-shot for sums within its size.
  void all_reduce_sum(void* buf, int64_t count, DType dtype) override;
  // ncclAllGather of bytes per rank on the backend's stream; in place when send == recv + rank * bytes.
  void all_gather(const void* send, void* recv, size_t bytes) override;
  // Waits for this rank's stream, then meets the others on the host communicator (never inside a
  // graph capture).
  void barrier() override;
  // "nccl 2.28.9", or with the peer-to-peer one-shot "p2p one-shot up to 262144 bytes, nccl 2.28.9 above".
  std::string describe() const override;
  // Marks the communicator failed: the destructor then aborts instead of destroying.
  void abort();
  // From another thread (the process group's watch, RankProcess): a peer died; ncclCommAbort now,
  // which ends a collective that waits for it, and every later call (and check_usable) throws
  // GroupStopped with `why`.
  void abort_from_watch(const std::string& why);
  void check_usable() const override;
  // A Watchdog of INGOT_TP_TIMEOUT_S whose expiry is abort_from_watch naming the limit: a peer alive
  // but absent from a collective ends the wait (and the command) with an error instead of a hang.
  Watchdog* wait_watchdog() override;
  // NCCL's version as a number (e.g. 22809 for 2.28.9), for logs.
  static int version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Communicator& host_;
  int rank_ = 0, world_ = 1;
};

}  // namespace ingot
