// The build step: checkpoint tensors are checked against the family's name table (presence, shape,
// dtype), then converted to the engine dtype and fused into the runtime layout.
#include "runtime/engine.h"

#include <cstring>
#include <random>

#include "core/error.h"
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

// Concatenates tensors along rows (the first axis) into one [sum rows, cols] weight.
HostTensor fuse_rows(const std::vector<TensorView>& parts, DType dt) {
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
  const Family& fam = find_family(spec.family);
  Checkpoint ck(dir);
  WeightTable table = fam.weights(spec);

  // Every required tensor present with its shape and a floating dtype, before any conversion work.
  std::map<std::string, TensorView> src;
  for (const WeightDecl& d : table.decls()) {
    const TensorEntry& e = ck.get(d.hf_name);
    if (e.shape != d.shape)
      throw Error(dir + ": tensor '" + d.hf_name + "' has shape " + shape_str(e.shape) + ", expected " +
                  shape_str(d.shape));
    if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16)
      throw Error(dir + ": tensor '" + d.hf_name + "' has dtype " + std::string(dtype_name(e.dtype)) +
                  ", expected a floating type (F32, F16, BF16)");
    src[d.name] = e.view();
  }

  Engine eng;
  eng.spec = spec;
  eng.weight_dtype = o.dtype ? *o.dtype : default_dtype(spec, ck, table.decls().front().hf_name);
  const DType dt = eng.weight_dtype;
  uint64_t total = 0, done = 0;
  for (auto& [n, v] : src) total += v.nbytes();
  auto advance = [&](const std::vector<TensorView>& parts) {
    for (const TensorView& p : parts) done += p.nbytes();
    if (o.progress) o.progress(done, total);
  };
  auto copy = [&](const std::string& name) {
    const TensorView& v = src.at(name);
    HostTensor t(dt, v.shape);
    convert_into(v, dt, t, 0);
    eng.weights.emplace(name, std::move(t));
    advance({v});
  };
  copy("tok_embeddings");
  copy("final_norm");
  if (!spec.tie_embeddings) copy("lm_head");
  for (int i = 0; i < spec.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* n : {"attn_norm", "wo", "mlp_norm", "w_down"}) copy(p + n);
    if (spec.o_bias) copy(p + "bo");
    if (spec.qk_norm) {
      copy(p + "q_norm");
      copy(p + "k_norm");
    }
    auto fuse = [&](const std::string& name, const std::vector<TensorView>& parts) {
      eng.weights.emplace(p + name, fuse_rows(parts, dt));
      advance(parts);
    };
    fuse("wqkv", {src.at(p + "wq"), src.at(p + "wk"), src.at(p + "wv")});
    if (spec.qkv_bias) fuse("bqkv", {src.at(p + "bq"), src.at(p + "bk"), src.at(p + "bv")});
    fuse("w_gate_up", {src.at(p + "w_gate"), src.at(p + "w_up")});
  }
  eng.provenance = {{"checkpoint", dir}, {"files", ck.files()}, {"dtype", std::string(dtype_name(dt))}};
  return eng;
}

Engine random_engine(const ModelSpec& spec, DType dt, uint64_t seed) {
  Engine eng;
  eng.spec = spec;
  eng.weight_dtype = dt;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto make = [&](const std::string& name, Shape shape, bool is_norm) {
    HostTensor t(dt, shape);
    const size_t n = size_t(t.numel());
    std::vector<float> buf(std::min<size_t>(n, 1 << 16));
    // Cheap fill: a block of random values repeated; benchmarks need realistic bytes, not statistics.
    for (float& v : buf) v = is_norm ? 1.0f : normal(rng);
    for (size_t i = 0; i < n; i += buf.size()) {
      size_t c = std::min(buf.size(), n - i);
      convert_from_f32(dt, buf.data(), static_cast<uint8_t*>(t.data()) + i * dtype_size(dt), c);
    }
    eng.weights.emplace(name, std::move(t));
  };
  const int64_t qkv_rows = spec.q_dim() + 2 * spec.kv_dim();
  make("tok_embeddings", {spec.vocab, spec.hidden}, false);
  make("final_norm", {spec.hidden}, true);
  if (!spec.tie_embeddings) make("lm_head", {spec.vocab, spec.hidden}, false);
  for (int i = 0; i < spec.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    make(p + "attn_norm", {spec.hidden}, true);
    make(p + "wqkv", {qkv_rows, spec.hidden}, false);
    if (spec.qkv_bias) make(p + "bqkv", {qkv_rows}, false);
    if (spec.qk_norm) {
      make(p + "q_norm", {spec.head_dim}, true);
      make(p + "k_norm", {spec.head_dim}, true);
    }
    make(p + "wo", {spec.hidden, spec.q_dim()}, false);
    if (spec.o_bias) make(p + "bo", {spec.hidden}, false);
    make(p + "mlp_norm", {spec.hidden}, true);
    make(p + "w_gate_up", {2 * spec.intermediate, spec.hidden}, false);
    make(p + "w_down", {spec.hidden, spec.intermediate}, false);
  }
  eng.provenance = {{"random_seed", seed}, {"dtype", std::string(dtype_name(dt))}};
  return eng;
}

}  // namespace ingot
