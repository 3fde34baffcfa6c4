// The tensor-parallel split: which share of a model each rank of a group holds, and the rank's slice of
// an Engine (docs/tensor-parallel.md). Attention is split by KV-head groups (q/k/v column-parallel, the
// output projection row-parallel), the MLP by the intermediate (gate/up column-parallel, down
// row-parallel), Qwen3.5's linear-attention layers by value-head groups the same way, and the LM head
// by the vocabulary, padded to a multiple of the group size; norms and the embedding are replicated.
#pragma once
#include <cstdint>
#include <string>

#include "io/engine.h"
#include "models/tp_spec.h"

namespace ingot {

// Rank `rank`'s slice of `engine`, laid out as the rank spec's weight table says. Replicated weights
// borrow the engine's memory (which must outlive the slice); split ones are copied. A row-parallel bias
// (o_proj's) is kept by rank 0 and zero elsewhere, so the all-reduce adds it once. INT4 engines are
// refused (not split yet).
Engine shard_engine(const Engine& engine, int world, int rank);

}  // namespace ingot
