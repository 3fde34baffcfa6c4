// The tensor-parallel split: which share of a model each rank of a group holds, and the rank's slice of
// an Engine (docs/tensor-parallel.md). Attention is split by KV-head groups (q/k/v column-parallel, the
// output projection row-parallel), the MLP by the intermediate (gate/up column-parallel, down
// row-parallel), Qwen3.5's linear-attention layers by value-head groups the same way, and the LM head
// by the vocabulary, padded to a multiple of the group size; norms and the embedding are replicated.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "io/engine.h"
#include "models/tp_spec.h"

namespace ingot {

// The split rule, one weight at a time: stores into `out.weights` rank `rank`'s share of `whole_tensor`,
// the whole model's weight `w` (an entry of the weight table of `whole`, the whole model's spec), and
// for a tied embedding also the rank's LM-head rows of it as "lm_head". Replicated weights borrow
// `whole_tensor`'s memory unless `own`, which copies them (for a caller that frees the whole tensor
// next). shard_engine and build_rank_engine both slice through this, so their bits agree.
void add_rank_weight(const ModelSpec& whole, const WeightSpec& w, const HostTensor& whole_tensor, int world, int rank,
                     bool own, Engine& out);

// A view of `engine`: its spec, dtype, quantization and provenance, every weight borrowing the engine's memory (which
// must outlive the view).
Engine borrowed_engine(const Engine& engine);

// Rank `rank`'s slice of `engine`, laid out as the rank spec's weight table says. Replicated weights
// borrow the engine's memory (which must outlive the slice); split ones are copied. A row-parallel bias
// (o_proj's) is kept by rank 0 and zero elsewhere, so the all-reduce adds it once. INT4 weights split
// as their 16-bit forms do: packed rows with their scales and zeros, columns by whole groups (the
// packed bytes, the groups' scales and zeros), so every rank's values are the whole weight's; a column
// cut that would split a group, or one of an act-order weight, is refused naming the weight.
Engine shard_engine(const Engine& engine, int world, int rank);

// The refusals shard_engine gives an INT4 engine of quantization `q` (a column cut through a group, or
// of an act-order weight), from the spec alone, so that a split that cannot be made is refused before
// any weight is read or quantized. q.tensors empty: every weight an engine may hold as INT4
// (int4_allowed); the LM head is cut by rows and never refused.
void check_int4_split(const ModelSpec& whole, const QuantConfig& q, int world, const std::string& flag = "--tp");
// The quantization check_int4_split checks, known before any weight is read: a published checkpoint's
// groups (published_group) as the runtime re-expresses them (int4_runtime_group) with its act-order
// flag, else a build's own --group-size (group_size); nullopt when neither is given (no INT4).
std::optional<QuantConfig> int4_split_config(const ModelSpec& whole, std::optional<int64_t> group_size,
                                             std::optional<int64_t> published_group, bool act_order);

// What a rank's streaming build held at most: the bytes of the slice made so far plus the one whole
// weight being sliced (the tests check it stays about total/world plus the largest weight).
struct RankBuildStats {
  uint64_t peak_bytes = 0;
  uint64_t largest_whole_bytes = 0;  // the largest whole weight made
};

// Rank `rank`'s slice built directly, without the whole engine: each weight is made whole (converted
// from the mmap'd checkpoint, or generated), sliced with add_rank_weight into an owned copy, and freed
// before the next. Bitwise shard_engine(build_engine(dir, options), world, rank) and
// shard_engine(random_engine(spec, dtype, seed), world, rank). INT4 is refused (a rank would have to
// quantize or convert its share alone: build the whole engine and shard it), and options.sink must be
// unset (it is this function's).
Engine build_rank_engine(const std::string& checkpoint_dir, const BuildOptions& options, int world, int rank,
                         RankBuildStats* stats = nullptr);
Engine random_rank_engine(const ModelSpec& spec, DType dtype, uint64_t seed, int world, int rank,
                          RankBuildStats* stats = nullptr);

}  // namespace ingot
