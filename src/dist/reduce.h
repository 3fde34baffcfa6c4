// The reduction every communicator over host memory shares, so that the in-process group (threads)
// and the process group (processes) give bitwise the same all_reduce_sum: the contributions added in
// rank order (rank 0 + rank 1 + ...), accumulated in f32, rounded once for 16-bit types.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace ingot {

// Throws Error naming the dtype unless it is f32, f16 or bf16 (what all_reduce_sum takes).
void check_reduce_dtype(DType dtype);

// out [count] of `dtype` = parts[0] + parts[1] + ... + parts[world-1], each part [count] of `dtype`,
// added in that order in f32 and written back rounded once. `out` may be one of the parts: it is written
// only after every part was read. sum and widened are scratch the caller keeps between calls.
void sum_in_rank_order(const void* const* parts, int world, int64_t count, DType dtype, void* out,
                       std::vector<float>& sum, std::vector<float>& widened);

}  // namespace ingot
