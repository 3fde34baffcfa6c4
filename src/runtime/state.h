// State: the static per-row state of every layer of a Model, allocated once when the Model is made,
// at addresses that never change (decode graphs are captured against them and replayed). It owns the
// buffers, their sizes, their zeroing, the raw row read that tests use, and the one capacity rule.
// Layers reach it through the typed StateView (models/state_layout.h) that ForwardContext carries.
//
// Attention layers keep K and V, one buffer each per layer (kv_shape in models/state_layout.h):
//   heads-first  [max_batch, kv_heads, capacity, head_dim]
//   flattened    [max_batch, capacity, kv_heads * head_dim]
// Linear-attention layers (Qwen3.5's Gated DeltaNet) keep, per layer, a conv state
// [max_batch, conv_channels, kernel - 1] and a recurrent state [max_batch, v_heads, k_dim, v_dim] in f32
// (linear_state_shape), with no capacity of their own: the capacity rule below stays the attention
// layers'. That state cannot be rewound: a row's next chunk continues exactly where its last one ended,
// or restarts the row at slot 0 (where the ops start from a zero state); State keeps each row's length
// and check_continuation refuses anything else, so a caller can never silently compute from a stale
// state.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "models/spec.h"
#include "models/state_layout.h"

namespace ingot {

class State {
 public:
  // The bounds a State is made for: capacity 0 takes default_capacity(spec); Error naming the limit
  // when the rows or slots are out of range.
  static CacheBounds resolve(const ModelSpec& spec, CacheBounds bounds);
  // Bytes the state of `spec` takes at resolved `bounds` in `dtype` (what the constructor allocates),
  // or nullopt beyond 2^64: plans check this before anything is allocated.
  static std::optional<size_t> bytes(const ModelSpec& spec, const CacheBounds& bounds, DType dtype);

  // Allocates and zeroes the state in the backend's activation dtype (so rows never written read as
  // zeros); the bounds are resolved first.
  State(Backend& backend, const ModelSpec& spec, const CacheBounds& bounds);

  const CacheBounds& bounds() const { return bounds_; }
  int max_batch() const { return bounds_.max_batch; }
  int64_t capacity() const { return bounds_.capacity; }
  CacheLayout layout() const { return bounds_.layout; }
  size_t bytes() const { return bytes_; }

  // The capacity rule. A chunk of `len` tokens written from `write_index` takes that row's slots
  // write_index .. write_index + len - 1, all below the capacity. A request of a prompt and up to
  // max_new_tokens generated tokens takes slots_needed() slots: the last generated token is never
  // written back.
  static int64_t slots_needed(int64_t prompt_len, int64_t max_new_tokens) {
    return prompt_len + std::max<int64_t>(max_new_tokens, 1) - 1;
  }
  // The most new tokens a request of prompt_len tokens fits in one row (below 1: none).
  int64_t max_new_tokens(int64_t prompt_len) const { return bounds_.capacity - prompt_len + 1; }
  // Error (prefixed by `who`) unless the chunk fits its row.
  void check_chunk(const std::string& who, int64_t write_index, int64_t len) const;
  // Error unless a request of prompt_len tokens and max_new_tokens new ones fits one row.
  void check_request(int64_t prompt_len, int64_t max_new_tokens) const;

  // Whether a row can continue from any slot it holds (attention only), or only from its end or slot 0
  // (linear layers: their state holds the row's whole past).
  bool rewindable() const { return !has_linear_; }
  // Error (prefixed by `who`) when a chunk at write_index cannot continue the row's linear state.
  void check_continuation(const std::string& who, int row, int64_t write_index) const;
  // Records that the row now holds `length` tokens (after a forward wrote them).
  void set_length(int row, int64_t length) { length_[size_t(row)] = length; }

  const StateView& view() const { return view_; }

  // The raw bytes of one row (K then V of every attention layer, then the conv and recurrent state of
  // every linear layer), for tests of slot preservation.
  std::vector<uint8_t> read_row(int row) const;

 private:
  Backend& be_;
  CacheBounds bounds_;    // resolved
  size_t row_bytes_ = 0;  // one row of one K (or V) buffer
  size_t conv_row_bytes_ = 0, rec_row_bytes_ = 0;  // one row of a linear layer's conv / recurrent state
  size_t bytes_ = 0;      // all buffers
  bool has_linear_ = false;
  std::vector<Buffer> k_, v_;        // [attention layers], each kv_shape(spec, bounds_)
  std::vector<Buffer> conv_, rec_;   // [linear layers], linear_state_shape(spec, max_batch)
  std::vector<int64_t> length_;      // [max_batch] tokens each row holds (kept for linear layers)
  StateView view_;
};

}  // namespace ingot
