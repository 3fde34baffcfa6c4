// Communicator: the collectives tensor parallelism needs, over buffers in one rank's backend memory.
// Every rank of a group calls the same collectives in the same order with the same sizes; a call
// returns on a rank once its own result is in place (on a device: once it is queued on the backend's
// stream, ordered before what follows there). Implementations: in_process.h (threads of one process,
// one CPU backend each, for CI); process_group.h (processes of one host, through rank 0, for the CPU
// backend); nccl_communicator.h (one process per GPU, collectives on the CUDA backend's stream and
// captured in the decode graph; its reduction order is stated there).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ingot {

class Watchdog;  // dist/watchdog.h

// Sizes a group may have: far above the 8 GPUs of one host, small enough that a mistyped --tp (1000)
// is refused before any thread or shard is made.
inline constexpr int kMaxTensorParallel = 64;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // buf [count] of `dtype` (f32, f16 or bf16) on every rank becomes the sum over ranks, added in rank
  // order (rank 0 + rank 1 + ... , accumulated in f32 and rounded once for 16-bit types), so every rank
  // holds bitwise the same result, which depends neither on timing nor on what else the buffer holds.
  // NCCL keeps this for 2 ranks and not the order for more (nccl_communicator.h).
  virtual void all_reduce_sum(void* buf, int64_t count, DType dtype) = 0;
  // recv [world, bytes]: rank r's `send` lands at recv + r * bytes on every rank. `send` may be
  // recv + rank * bytes (in place), as NCCL allows.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  virtual void barrier() = 0;
  // Throws (GroupStopped) when the communicator was stopped behind the caller's back (a peer died
  // while this rank waited on the device: nccl_communicator.h), so that results read back after such a
  // wait are not taken for sums. The host groups fail inside the collective itself: nothing to check.
  virtual void check_usable() const {}
  // The deadline on this rank's host waiting for device work that holds collectives (a caller marks
  // such a wait with Watchdog::Wait): a communicator that cannot time out by itself (NCCL) stops the
  // group when the wait passes INGOT_TP_TIMEOUT_S, and check_usable() then throws. Null where the
  // collectives are host calls that fail by themselves (the CPU groups).
  virtual Watchdog* wait_watchdog() { return nullptr; }
  // What carries the collectives, for logs and bench results ("nccl 2.28.9", ...).
  virtual std::string describe() const = 0;
};

}  // namespace ingot
