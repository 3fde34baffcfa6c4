// The static per-row state of a model as the model level describes it: the bounds it is allocated for
// (cache rows, slots per row, K/V layout), the shape of an attention layer's K and V, and StateView,
// the typed window through which layers read and write it. runtime/state.h allocates the buffers from
// these shapes; io/engine_file.h records the bounds and the shapes in engine metadata. Both take them
// from here, so the file and the memory cannot describe different caches.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "models/spec.h"

namespace ingot {

enum class CacheLayout { HeadsFirst, Flattened };
std::string layout_name(CacheLayout l);
CacheLayout parse_layout(const std::string& s);  // Error unless heads_first or flattened

// Limits of the bounds: the backends index cache rows and slots with int32, and no larger figure is a
// real request. Engine files are held to the same limits.
inline constexpr int kMaxBatch = 1 << 20;
inline constexpr int64_t kMaxCapacity = int64_t(1) << 30;

// Cache slots a run gets when it names none, and the capacity `ingot build` stores by default: long
// enough for a conversation, while max_position_embeddings (40960 for Qwen3, 131072 for Llama 3.1)
// would cost gigabytes of cache per row that a short request never touches.
inline constexpr int64_t kDefaultCapacity = 4096;

// What a Model's state is allocated for, and what an engine file is built for.
struct CacheBounds {
  int max_batch = 1;     // cache rows
  int64_t capacity = 0;  // cache slots per row; 0 = default_capacity(spec)
  CacheLayout layout = CacheLayout::HeadsFirst;
};

// The capacity of bounds that name none: min(kDefaultCapacity, max_position_embeddings).
int64_t default_capacity(const ModelSpec& spec);

// One attention layer's K buffer (its V buffer is the same), for a spec and bounds with the capacity
// resolved.
struct KvShape {
  Shape shape;                    // heads-first [max_batch, kv_heads, capacity, head_dim]
                                  // flattened   [max_batch, capacity, kv_heads * head_dim]
  std::vector<std::string> axes;  // the names of shape's axes, as engine metadata records them
  int capacity_axis = 0;          // the axis that holds the slots
  // Element strides of the view (KvLayerView): both layouts are settings of the same addressing.
  int64_t batch_stride = 0, head_stride = 0, slot_stride = 0;
};
KvShape kv_shape(const ModelSpec& spec, const CacheBounds& bounds);

// A linear-attention layer's state (f32 whatever the activation dtype; no capacity: a row's whole past
// is carried in it). Sizes per cache row:
struct LinearStateShape {
  Shape conv;       // [max_batch, conv_channels, conv_kernel - 1]: a row's last kernel - 1 conv inputs
  Shape recurrent;  // [max_batch, v_heads, k_dim, v_dim]: the gated delta rule's S per value head
};
LinearStateShape linear_state_shape(const ModelSpec& spec, int max_batch);

struct LinearLayerView {
  float* conv = nullptr;       // LinearStateShape::conv
  float* recurrent = nullptr;  // LinearStateShape::recurrent
};

// The layers' typed window on the static state that runtime/state.h owns: each layer's view of its
// buffers, at addresses fixed for the Model's life (captured decode graphs replay against them).
// Attention layers keep K/V (kv()); linear-attention layers their conv and recurrent state (linear()).
class StateView {
 public:
  StateView() = default;
  StateView(std::vector<KvLayerView> kv, std::vector<LinearLayerView> linear)
      : kv_(std::move(kv)), linear_(std::move(linear)) {}
  const KvLayerView& kv(int layer) const { return kv_[size_t(layer)]; }
  const LinearLayerView& linear(int layer) const { return linear_[size_t(layer)]; }

 private:
  std::vector<KvLayerView> kv_;          // [layers]; empty views for linear layers
  std::vector<LinearLayerView> linear_;  // [layers]; empty views for attention layers
};

}  // namespace ingot
