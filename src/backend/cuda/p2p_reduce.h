// The one-shot all-reduce over peer-to-peer memory (dist/p2p_all_reduce.h owns the memory and the
// handles; this is its kernel's entry). Written by hand: no library here offers a reduction whose order
// is fixed (NCCL's is not for more than 2 ranks), and the sizes it serves are a decode step's few KiB.
//
// Each of the world ranks runs the same kernel of kP2pBlocks blocks on its own GPU. Block b takes the
// b-th slice of the buffer, writes its slice into every rank's staging area (its own place in the
// slot of this call), raises its flag on every rank, waits until every rank's block b has raised its
// flag here, and then adds the world slices it received, rank 0 first, in f32, rounding once to the
// buffer's dtype: the same arithmetic as the in-process group's sum_in_rank_order (dist/reduce.h), so
// every rank holds bitwise the same result and it equals what the CPU groups compute.
//
// Calls are counted on the device (one counter per block, advanced by the kernel itself), so the
// kernel can be captured in a graph and replayed: nothing of a call is baked into its arguments.
// Two slots alternate between calls; a rank can only begin call c + 2 (slot c % 2 again) after every
// rank has raised its flag for call c + 1, which each does only after its call c finished reading.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ingot::cuda {

inline constexpr int kP2pMaxRanks = 8;  // the GPUs of one host that NVLink joins
inline constexpr int kP2pBlocks = 32;   // every call's grid, the same on every rank (the flags are per block)

struct P2pReduceParams {
  void* buf = nullptr;  // [count] this rank's addend in, the sum out (in place)
  int64_t count = 0;    // elements; count * element size <= slot_bytes
  int rank = 0, world = 1;
  // staging[r]: rank r's staging memory as mapped in this process: [2 slots, world, slot_bytes]
  uint8_t* staging[kP2pMaxRanks] = {};
  // flags[r]: rank r's flags as mapped here: [kP2pBlocks, world] uint32, entry [b, q] = the last call
  // whose block b of rank q delivered its slice to rank r
  uint32_t* flags[kP2pMaxRanks] = {};
  uint32_t* calls = nullptr;  // [kP2pBlocks] this rank's call count per block (device memory, zero at start)
  int64_t slot_bytes = 0;     // bytes of one rank's place in a slot (a multiple of 16)
  uint64_t timeout_ns = 0;    // a block that waits longer for a peer stops the kernel (trap), 0: never
  int* host_words = nullptr;  // host-mapped [2]: [0] 1 + the rank waited for, written before a timeout's
                              // trap; [1] nonzero: the host knows a peer is dead, stop waiting (trap)
};

// Queues the all-reduce on s (f32, f16, bf16); throws Error naming the problem for a dtype, size or
// world it does not take.
void p2p_reduce_sum(const P2pReduceParams& p, DType dtype, cudaStream_t s);

}  // namespace ingot::cuda
