#include "models/state_layout.h"

#include <algorithm>

#include "core/error.h"

namespace ingot {

std::string layout_name(CacheLayout l) { return l == CacheLayout::HeadsFirst ? "heads_first" : "flattened"; }

CacheLayout parse_layout(const std::string& s) {
  if (s == "heads_first") return CacheLayout::HeadsFirst;
  if (s == "flattened") return CacheLayout::Flattened;
  throw Error("unknown cache layout '" + s + "' (expected heads_first or flattened)");
}

int64_t default_capacity(const ModelSpec& spec) { return std::max<int64_t>(1, std::min(spec.max_position, kDefaultCapacity)); }

KvShape kv_shape(const ModelSpec& s, const CacheBounds& b) {
  KvShape k;
  k.batch_stride = s.kv_heads * b.capacity * s.head_dim;
  if (b.layout == CacheLayout::HeadsFirst) {
    k.shape = {b.max_batch, s.kv_heads, b.capacity, s.head_dim};
    k.axes = {"batch", "kv_heads", "capacity", "head_dim"};
    k.capacity_axis = 2;
    k.head_stride = b.capacity * s.head_dim;
    k.slot_stride = s.head_dim;
  } else {
    k.shape = {b.max_batch, b.capacity, s.kv_heads * s.head_dim};
    k.axes = {"batch", "capacity", "kv_heads*head_dim"};
    k.capacity_axis = 1;
    k.head_stride = s.head_dim;
    k.slot_stride = s.kv_heads * s.head_dim;
  }
  return k;
}

LinearStateShape linear_state_shape(const ModelSpec& s, int max_batch) {
  const LinearAttnSpec& l = s.linear;
  return {{max_batch, l.conv_channels(), l.conv_kernel - 1}, {max_batch, l.v_heads, l.k_dim, l.v_dim}};
}

}  // namespace ingot
