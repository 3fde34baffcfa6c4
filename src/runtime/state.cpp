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
  auto product = [](size_t n, const Shape& shape) -> std::optional<size_t> {
    for (int64_t d : shape)
      if (d < 0 || __builtin_mul_overflow(n, size_t(d), &n)) return std::nullopt;
    return n;
  };
  const size_t attention = size_t(spec.layers_of(LayerKind::Attention)), linear = size_t(spec.layers_of(LayerKind::Linear));
  // K and V of every attention layer.
  std::optional<size_t> kv = product(dtype_size(dtype), kv_shape(spec, bounds).shape);
  size_t n = 0;
  if (!kv || __builtin_mul_overflow(*kv, 2 * attention, &n)) return std::nullopt;
  if (linear == 0) return n;
  // Conv and recurrent state (f32) of every linear layer.
  const LinearStateShape ls = linear_state_shape(spec, bounds.max_batch);
  std::optional<size_t> conv = product(sizeof(float), ls.conv), rec = product(sizeof(float), ls.recurrent);
  size_t per = 0, all = 0;
  if (!conv || !rec || __builtin_add_overflow(*conv, *rec, &per) || __builtin_mul_overflow(per, linear, &all) ||
      __builtin_add_overflow(n, all, &n))
    return std::nullopt;
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
  size_t per_buffer = dtype_size(dt);
  for (int64_t d : shape.shape) per_buffer *= size_t(d);
  row_bytes_ = per_buffer / size_t(bounds_.max_batch);
  const LinearStateShape ls = linear_state_shape(spec, bounds_.max_batch);
  conv_row_bytes_ = sizeof(float) * size_t(numel(ls.conv) / bounds_.max_batch);
  rec_row_bytes_ = sizeof(float) * size_t(numel(ls.recurrent) / bounds_.max_batch);
  length_.assign(size_t(bounds_.max_batch), 0);
  auto zeroed = [&](std::vector<Buffer>& list, size_t n) {
    list.emplace_back(be_, n);
    be_.fill_zero(list.back().get(), n);
    return list.back().get();
  };
  std::vector<KvLayerView> views(size_t(spec.layers));
  std::vector<LinearLayerView> linear(size_t(spec.layers));
  for (int64_t l = 0; l < spec.layers; ++l) {
    if (spec.kind(l) == LayerKind::Linear) {
      has_linear_ = true;
      linear[size_t(l)].conv = static_cast<float*>(zeroed(conv_, conv_row_bytes_ * size_t(bounds_.max_batch)));
      linear[size_t(l)].recurrent = static_cast<float*>(zeroed(rec_, rec_row_bytes_ * size_t(bounds_.max_batch)));
      continue;
    }
    KvLayerView& v = views[size_t(l)];
    v.k = zeroed(k_, per_buffer);
    v.v = zeroed(v_, per_buffer);
    v.dtype = dt;
    v.capacity = bounds_.capacity;
    v.batch_stride = shape.batch_stride;
    v.head_stride = shape.head_stride;
    v.slot_stride = shape.slot_stride;
  }
  view_ = StateView(std::move(views), std::move(linear));
}

void State::check_continuation(const std::string& who, int row, int64_t write_index) const {
  if (!has_linear_ || write_index == 0 || write_index == length_[size_t(row)]) return;
  throw Error(who + ": the row's recurrent (linear-attention) state holds its first " +
              std::to_string(length_[size_t(row)]) + " tokens, so a chunk can continue it only at write index " +
              std::to_string(length_[size_t(row)]) + " or restart it at 0, not at " + std::to_string(write_index));
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
  auto take = [&](const Buffer& b, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    be_.download(out.data() + at, b.as<uint8_t>() + size_t(row) * n, n);
  };
  for (size_t l = 0; l < k_.size(); ++l) {
    take(k_[l], row_bytes_);
    take(v_[l], row_bytes_);
  }
  for (size_t l = 0; l < conv_.size(); ++l) {
    take(conv_[l], conv_row_bytes_);
    take(rec_[l], rec_row_bytes_);
  }
  return out;
}

}  // namespace ingot
