#include "runtime/state.h"

#include "core/error.h"

namespace ingot {

CacheBounds State::resolve(const ModelSpec& spec, CacheBounds b) {
  if (b.max_batch < 1) throw Error("max batch must be at least 1, got " + std::to_string(b.max_batch));
  if (b.max_batch > kMaxBatch)
    throw Error("max batch " + std::to_string(b.max_batch) + " exceeds the limit of " + std::to_string(kMaxBatch) +
                " cache rows");
  if (b.capacity == 0) b.capacity = default_capacity(spec);
  if (b.capacity < 1) throw Error("capacity must be at least 1, got " + std::to_string(b.capacity));
  if (b.capacity > kMaxCapacity) throw Error("capacity " + std::to_string(b.capacity) + " exceeds 2^30 slots");
  return b;
}

std::optional<size_t> State::bytes(const ModelSpec& spec, const CacheBounds& bounds, DType dtype) {
  size_t n = dtype_size(dtype);
  for (int64_t d : kv_shape(spec, bounds).shape)
    if (d < 0 || __builtin_mul_overflow(n, size_t(d), &n)) return std::nullopt;
  // K and V of every layer.
  if (__builtin_mul_overflow(n, 2 * size_t(spec.layers), &n)) return std::nullopt;
  return n;
}

State::State(Backend& be, const ModelSpec& spec, const CacheBounds& bounds) : be_(be), bounds_(resolve(spec, bounds)) {
  const KvShape shape = kv_shape(spec, bounds_);
  const DType dt = be_.activation_dtype();
  const std::optional<size_t> total = bytes(spec, bounds_, dt);
  if (!total)
    throw Error("the KV cache for max batch " + std::to_string(bounds_.max_batch) + " x capacity " +
                std::to_string(bounds_.capacity) + " of this model exceeds 2^64 bytes");
  bytes_ = *total;
  const size_t per_buffer = bytes_ / (2 * size_t(spec.layers));
  row_bytes_ = per_buffer / size_t(bounds_.max_batch);
  std::vector<KvLayerView> views;
  for (int64_t l = 0; l < spec.layers; ++l) {
    for (std::vector<Buffer>* kv : {&k_, &v_}) {
      kv->emplace_back(be_, per_buffer);
      be_.fill_zero(kv->back().get(), per_buffer);
    }
    KvLayerView v;
    v.k = k_.back().get();
    v.v = v_.back().get();
    v.dtype = dt;
    v.capacity = bounds_.capacity;
    v.batch_stride = shape.batch_stride;
    v.head_stride = shape.head_stride;
    v.slot_stride = shape.slot_stride;
    views.push_back(v);
  }
  view_ = StateView(std::move(views));
}

void State::check_chunk(const std::string& who, int64_t write_index, int64_t len) const {
  if (write_index + len > bounds_.capacity)
    throw Error(who + ": needs cache slots up to " + std::to_string(write_index + len) + " but the capacity is " +
                std::to_string(bounds_.capacity));
}

void State::check_request(int64_t prompt_len, int64_t max_new_tokens) const {
  const int64_t need = slots_needed(prompt_len, max_new_tokens);
  if (need > bounds_.capacity)
    throw Error("generate: the request needs " + std::to_string(need) + " cache slots (prompt " +
                std::to_string(prompt_len) + " + max_new_tokens " + std::to_string(max_new_tokens) +
                " - 1) but the capacity is " + std::to_string(bounds_.capacity));
}

std::vector<uint8_t> State::read_row(int row) const {
  std::vector<uint8_t> out;
  for (size_t l = 0; l < k_.size(); ++l) {
    for (const Buffer* b : {&k_[l], &v_[l]}) {
      const size_t at = out.size();
      out.resize(at + row_bytes_);
      be_.download(out.data() + at, b->as<uint8_t>() + size_t(row) * row_bytes_, row_bytes_);
    }
  }
  return out;
}

}  // namespace ingot
