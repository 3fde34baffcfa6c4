// The sizes of a tensor-parallel split (docs/tensor-parallel.md): which heads, KV heads, intermediate
// columns and LM-head rows each rank of a group holds, and the spec a rank runs. Here, below io, so that
// an engine file holding one rank's slice (`ingot build --tp N`) is validated against its rank's spec;
// the weights' slicing itself is runtime/tp_split.h.
#pragma once
#include <cstdint>
#include <string>

#include "models/spec.h"

namespace ingot {

// A contiguous share of heads.
struct HeadShare {
  int64_t first = 0, count = 0;
};
// The query heads of one rank and the KV heads they read. Each rank owns heads/world query heads and
// whole groups of them: with kv_heads >= world, kv_heads/world KV heads and all their query heads;
// with fewer KV heads than ranks, one KV head that several ranks replicate, each with a disjoint part
// of its query heads. (For linear attention: value heads and the key heads they read.)
struct RankHeads {
  HeadShare q, kv;
};
// Valid only when check_tensor_parallel accepts the sizes.
RankHeads rank_heads(int64_t heads, int64_t kv_heads, int world, int rank);

// Refuses, naming `flag` and the config field, a group size the model cannot be split over: outside
// [1, kMaxTensorParallel], attention (or linear value) heads that are not a multiple of it, ranks that
// would not own whole KV-head groups, an intermediate size that is not a multiple of it. The
// vocabulary needs no multiple (padded).
void check_tensor_parallel(const ModelSpec& spec, int world, const std::string& flag = "--tp");

// The spec rank `rank` of `world` runs: its heads, KV heads, intermediate and linear heads, an untied
// LM head of spec.tp.vocab_rows rows.
ModelSpec rank_spec(const ModelSpec& spec, int world, int rank);

}  // namespace ingot
