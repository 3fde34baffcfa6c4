// The one-shot all-reduce over peer-to-peer memory (issue 15, part 3): for the small sums of a decode
// step (a few rows of the hidden state, KiB), where NCCL's ring or tree spends its time in protocol
// steps rather than in bytes. Every rank writes its addend straight into every peer's staging memory
// (CUDA IPC, over NVLink where the GPUs have it), meets the others on flags, and adds the world addends
// in rank order: one kernel, one round trip (backend/cuda/p2p_reduce.h has the kernel and its
// protocol). Its sum is bitwise the in-process group's (dist/reduce.h) for any world size, where NCCL's
// is only for two ranks.
//
// Compiled only in a CUDA build with NCCL (it lives beside NcclCommunicator, which chooses between
// the two by size: nccl_communicator.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "dist/communicator.h"

namespace ingot {

class P2pAllReduce {
 public:
  // Collective over `host` (every rank calls it at the same point with the same max_bytes). Returns
  // null on every rank, with `why` saying why, when peer-to-peer memory is not usable between every pair
  // of the ranks' GPUs (or the world is outside 2..8): the ranks agree, so either all use it or none.
  // `backend` is a CUDA backend that outlives the result; max_bytes is the largest sum it will take.
  static std::unique_ptr<P2pAllReduce> open(Communicator& host, Backend& backend, size_t max_bytes, std::string& why);
  ~P2pAllReduce();
  P2pAllReduce(const P2pAllReduce&) = delete;
  P2pAllReduce& operator=(const P2pAllReduce&) = delete;

  size_t max_bytes() const;
  // buf [count] of dtype (f32, f16, bf16; count * size <= max_bytes) becomes the rank-order sum, queued
  // on the backend's stream (and so recorded by a graph capture). Every rank calls it alike.
  void all_reduce_sum(void* buf, int64_t count, DType dtype);
  // After a CUDA failure: the peer rank a block gave up waiting for (timeout), or -1.
  int timed_out_on() const;
  // From another thread (a peer is known dead): a kernel waiting for a peer stops (trap) within about a
  // millisecond instead of at the timeout.
  void abort();

 private:
  struct Impl;
  explicit P2pAllReduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ingot
