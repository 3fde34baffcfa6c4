#include "models/tp_spec.h"

#include "core/error.h"
#include "dist/communicator.h"

namespace ingot {

namespace {

std::string tp_where(const std::string& flag, int world) { return flag + " " + std::to_string(world) + ": "; }

// Heads `heads` reading `kv_heads` shared heads (groups of heads/kv_heads), split over `world` ranks.
void check_groups(const std::string& where, int64_t heads, const char* heads_field, int64_t kv_heads,
                  const char* kv_field, int world) {
  if (heads % world != 0)
    throw Error(where + "the model's " + std::to_string(heads) + " " + heads_field + " do not split evenly over " +
                std::to_string(world) + " ranks");
  const int64_t per_rank = heads / world, group = heads / kv_heads;
  if (per_rank % group != 0 && group % per_rank != 0)
    throw Error(where + std::to_string(per_rank) + " of the " + std::to_string(heads) + " " + heads_field +
                " per rank would not make whole groups of the " + std::to_string(group) + " that share each of the " +
                std::to_string(kv_heads) + " " + kv_field + " (a rank must own whole groups, or a part of one group)");
}

}  // namespace

RankHeads rank_heads(int64_t heads, int64_t kv_heads, int world, int rank) {
  const int64_t per_rank = heads / world, group = heads / kv_heads;
  RankHeads h;
  h.q = {rank * per_rank, per_rank};
  h.kv.first = h.q.first / group;
  h.kv.count = (h.q.first + per_rank - 1) / group + 1 - h.kv.first;
  return h;
}

void check_tensor_parallel(const ModelSpec& s, int world, const std::string& flag) {
  const std::string where = tp_where(flag, world);
  if (world < 1 || world > kMaxTensorParallel)
    throw Error(where + "the number of tensor-parallel ranks must lie in [1, " + std::to_string(kMaxTensorParallel) + "]");
  if (world == 1) return;
  if (s.tp.world > 1) throw Error(where + "the model is already one rank's slice");
  check_groups(where, s.heads, "attention heads (num_attention_heads)", s.kv_heads, "KV heads (num_key_value_heads)",
               world);
  if (s.intermediate % world != 0)
    throw Error(where + "the model's intermediate_size " + std::to_string(s.intermediate) +
                " does not split evenly over " + std::to_string(world) + " ranks");
  if (s.has_linear_layers())
    check_groups(where, s.linear.v_heads, "linear-attention value heads (linear_num_value_heads)", s.linear.k_heads,
                 "key heads (linear_num_key_heads)", world);
}

ModelSpec rank_spec(const ModelSpec& spec, int world, int rank) {
  check_tensor_parallel(spec, world);
  ModelSpec s = spec;
  if (world == 1) return s;
  const RankHeads a = rank_heads(spec.heads, spec.kv_heads, world, rank);
  s.heads = a.q.count;
  s.kv_heads = a.kv.count;
  s.intermediate = spec.intermediate / world;
  if (spec.has_linear_layers()) {
    const RankHeads l = rank_heads(spec.linear.v_heads, spec.linear.k_heads, world, rank);
    s.linear.v_heads = l.q.count;
    s.linear.k_heads = l.kv.count;
  }
  s.tie_embeddings = false;  // each rank holds its own rows of the LM head
  s.tp = {world, rank, (spec.vocab + world - 1) / world};
  return s;
}

}  // namespace ingot
