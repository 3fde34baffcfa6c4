// The build step: checkpoint tensors are checked against the family's weight table (presence, shape,
// dtype), then converted to the engine dtype and stacked into the runtime layout; and random engines
// of the same layout.
#include "io/engine.h"

#include <cstring>
#include <random>

#include "core/error.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/family.h"

namespace ingot {

const HostTensor& Engine::get(const std::string& name) const {
  const HostTensor* t = find(name);
  if (!t) throw Error("engine has no weight '" + name + "'");
  return *t;
}

size_t Engine::weight_bytes() const {
  size_t n = 0;
  for (auto& [k, t] : weights) n += t.nbytes();
  return n;
}

namespace {

// Copies (converting if needed) `src` into dst at byte offset `at`, as dtype dt.
void convert_into(const TensorView& src, DType dt, HostTensor& dst, size_t at_elems) {
  uint8_t* out = static_cast<uint8_t*>(dst.data()) + at_elems * dtype_size(dt);
  const size_t n = size_t(src.numel());
  if (src.dtype == dt) {
    std::memcpy(out, src.data, src.nbytes());
    return;
  }
  std::vector<float> tmp(std::min<size_t>(n, 1 << 20));
  for (size_t i = 0; i < n; i += tmp.size()) {
    size_t c = std::min(tmp.size(), n - i);
    convert_to_f32(src.dtype, static_cast<const uint8_t*>(src.data) + i * dtype_size(src.dtype), tmp.data(), c);
    convert_from_f32(dt, tmp.data(), out + i * dtype_size(dt), c);
  }
}

// Concatenates tensors along rows (the first axis) into one [sum rows, cols] weight (one part: a copy).
HostTensor stack_rows(const std::vector<TensorView>& parts, DType dt) {
  int64_t rows = 0;
  for (auto& p : parts) rows += p.shape[0];
  Shape shape = parts[0].shape;
  shape[0] = rows;
  HostTensor out(dt, shape);
  size_t at = 0;
  for (auto& p : parts) {
    convert_into(p, dt, out, at);
    at += size_t(p.numel());
  }
  return out;
}

DType default_dtype(const ModelSpec& s, const Checkpoint& ck, const std::string& any_tensor) {
  if (s.torch_dtype == "float32") return DType::F32;
  if (s.torch_dtype == "float16") return DType::F16;
  if (s.torch_dtype == "bfloat16") return DType::BF16;
  return ck.get(any_tensor).dtype;
}

}  // namespace

Engine build_engine(const std::string& dir, const BuildOptions& o) {
  ModelSpec spec = load_model_spec(dir);
  const WeightTable table = weight_table(spec);
  Checkpoint ck(dir);

  // Every source tensor present with its shape and a floating dtype, before any conversion work.
  std::vector<std::vector<TensorView>> parts;  // [table entries][sources]
  uint64_t total = 0, done = 0;
  for (const WeightSpec& w : table.entries()) {
    std::vector<TensorView>& views = parts.emplace_back();
    for (const WeightSource& src : w.sources) {
      const TensorEntry& e = ck.get(src.hf_name);
      if (e.shape != src.shape)
        throw Error(dir + ": tensor '" + src.hf_name + "' has shape " + shape_str(e.shape) + ", expected " +
                    shape_str(src.shape));
      if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16)
        throw Error(dir + ": tensor '" + src.hf_name + "' has dtype " + std::string(dtype_name(e.dtype)) +
                    ", expected a floating type (F32, F16, BF16)");
      views.push_back(e.view());
      total += views.back().nbytes();
    }
  }

  Engine eng;
  eng.spec = spec;
  eng.weight_dtype = o.dtype ? *o.dtype : default_dtype(spec, ck, table.entries().front().sources.front().hf_name);
  for (size_t i = 0; i < parts.size(); ++i) {
    eng.weights.emplace(table.entries()[i].name, stack_rows(parts[i], eng.weight_dtype));
    for (const TensorView& p : parts[i]) done += p.nbytes();
    if (o.progress) o.progress(done, total);
  }
  eng.provenance = {{"checkpoint", dir}, {"files", ck.files()}, {"dtype", std::string(dtype_name(eng.weight_dtype))}};
  return eng;
}

Engine random_engine(const ModelSpec& spec, DType dt, uint64_t seed) {
  Engine eng;
  eng.spec = spec;
  eng.weight_dtype = dt;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const WeightTable table = weight_table(spec);
  for (const WeightSpec& w : table.entries()) {
    HostTensor t(dt, w.shape);
    const size_t n = size_t(t.numel());
    std::vector<float> buf(std::min<size_t>(n, 1 << 16));
    // Cheap fill: a block of random values repeated; benchmarks need realistic bytes, not statistics.
    for (float& v : buf) v = w.init == WeightInit::Ones ? 1.0f : normal(rng);
    for (size_t i = 0; i < n; i += buf.size()) {
      size_t c = std::min(buf.size(), n - i);
      convert_from_f32(dt, buf.data(), static_cast<uint8_t*>(t.data()) + i * dtype_size(dt), c);
    }
    eng.weights.emplace(w.name, std::move(t));
  }
  eng.provenance = {{"random_seed", seed}, {"dtype", std::string(dtype_name(dt))}};
  return eng;
}

}  // namespace ingot
