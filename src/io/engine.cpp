// The build step: checkpoint tensors are checked against the family's weight table (presence, shape,
// dtype, and no tensor left over), then converted to the engine dtype and stacked into the runtime
// layout, each converted chunk checked for NaN and infinity while it is still in cache; and random
// engines of the same layout.
#include "io/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "io/model_config.h"
#include "io/quantized_checkpoint.h"
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

// FNV-1a of a weight's name: the per-weight seed of random_engine (stable across builds and machines,
// unlike std::hash).
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The index of the first NaN or infinity among n values of a floating dtype, or n: an all-ones
// exponent field. The flag loop has no early exit so that it vectorises.
template <typename U>
size_t first_non_finite_bits(const U* v, size_t n, U exponent) {
  bool any = false;
  for (size_t i = 0; i < n; ++i) any |= (v[i] & exponent) == exponent;
  if (!any) return n;
  size_t i = 0;
  while ((v[i] & exponent) != exponent) ++i;
  return i;
}
size_t first_non_finite(DType dt, const void* data, size_t n) {
  switch (dt) {
    case DType::F32: return first_non_finite_bits(static_cast<const uint32_t*>(data), n, uint32_t(0x7f800000u));
    case DType::F16: return first_non_finite_bits(static_cast<const uint16_t*>(data), n, uint16_t(0x7c00u));
    case DType::BF16: return first_non_finite_bits(static_cast<const uint16_t*>(data), n, uint16_t(0x7f80u));
    default: return n;
  }
}

// "[i, j]" for a flat element index of a tensor of this shape.
std::string index_str(const Shape& shape, size_t flat) {
  std::string out;
  for (size_t d = shape.size(); d-- > 0;) {
    const size_t dim = size_t(shape[d]);
    out = std::to_string(flat % dim) + (out.empty() ? "" : ", ") + out;
    flat /= dim;
  }
  return "[" + out + "]";
}

// One checkpoint tensor: its view and its name in the checkpoint, for errors.
struct Source {
  TensorView view;
  std::string hf_name;
};

// Copies (converting if needed) `src` into dst at element offset `at_elems`, as dtype dt, checking
// every chunk of the result for NaN and infinity while it is in cache: a value the checkpoint holds, or
// one that overflows a narrower engine dtype.
void convert_into(const Source& src, DType dt, HostTensor& dst, size_t at_elems, const std::string& dir) {
  uint8_t* out = static_cast<uint8_t*>(dst.data()) + at_elems * dtype_size(dt);
  const TensorView& v = src.view;
  const uint8_t* in = static_cast<const uint8_t*>(v.data);
  const size_t n = size_t(v.numel());
  const size_t in_es = dtype_size(v.dtype), out_es = dtype_size(dt);
  constexpr size_t kChunk = size_t(1) << 16;
  std::vector<float> tmp(v.dtype == dt ? 0 : std::min(n, kChunk));
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t c = std::min(kChunk, n - i);
    if (v.dtype == dt) {
      std::memcpy(out + i * out_es, in + i * in_es, c * in_es);
    } else {
      convert_to_f32(v.dtype, in + i * in_es, tmp.data(), c);
      convert_from_f32(dt, tmp.data(), out + i * out_es, c);
    }
    const size_t bad = first_non_finite(dt, out + i * out_es, c);
    if (bad == c) continue;
    const size_t at = i + bad;
    float orig = 0;
    convert_to_f32(v.dtype, in + at * in_es, &orig, 1);
    const std::string where = dir + ": tensor '" + src.hf_name + "' ";
    if (std::isfinite(orig))
      throw Error(where + "holds " + std::to_string(orig) + " at index " + index_str(v.shape, at) +
                  ", which overflows " + std::string(dtype_name(dt)) + "; build with a wider --dtype");
    throw Error(where + "holds a non-finite value (" + std::string(std::isnan(orig) ? "NaN" : orig > 0 ? "inf" : "-inf") +
                ") at index " + index_str(v.shape, at) + "; the checkpoint is damaged and cannot run");
  }
}

// Concatenates tensors (or the rows each one's pick selects) along rows into one weight of the
// table's runtime shape and storage dtype (one part: a copy), then adds the storage constant in f32.
HostTensor stack_rows(const std::vector<Source>& parts, const WeightSpec& w, DType engine_dt, const std::string& dir) {
  const DType dt = w.dtype(engine_dt);
  HostTensor out(dt, w.shape);
  size_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Source& p = parts[i];
    const RowPick& pick = w.sources[i].pick;
    if (!pick.block) {
      convert_into(p, dt, out, at, dir);
      at += size_t(p.view.numel());
      continue;
    }
    const int64_t row_elems = p.view.numel() / p.view.shape[0];
    for (int64_t r0 = pick.offset; r0 < p.view.shape[0]; r0 += pick.stride) {
      Source block = p;
      block.view.shape[0] = pick.block;
      block.view.data = static_cast<const uint8_t*>(p.view.data) + size_t(r0 * row_elems) * dtype_size(p.view.dtype);
      convert_into(block, dt, out, at, dir);
      at += size_t(pick.block * row_elems);
    }
  }
  if (w.storage.add != 0.0f) {
    if (dt != DType::F32) throw Error("weight '" + w.name + "': a folded constant needs f32 storage");
    float* v = out.as<float>();
    for (int64_t i = 0; i < out.numel(); ++i) v[i] += w.storage.add;
  }
  return out;
}

// Tensors some checkpoints carry that no model reads: the rotary inverse frequencies older
// transformers saved as a buffer (recomputed from config.json, as transformers does on load).
bool is_derived_buffer(const std::string& name) {
  const std::string tail = "rotary_emb.inv_freq";
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// Checkpoint tensors the config's model does not use: refused when they could change what the model
// computes (extra layers, biases the config turns off, ...), a warning when they cannot.
void check_unused(const std::string& dir, const ModelSpec& spec, const Checkpoint& ck, const WeightTable& table,
                  std::set<std::string> used, const std::function<void(const std::string&)>& warn) {
  std::string embedding;
  for (const WeightSpec& w : table.entries()) {
    for (const WeightSource& src : w.sources) used.insert(src.hf_name);
    if (w.name == "tok_embeddings") embedding = w.sources.front().hf_name;
  }
  std::vector<std::string> unused;
  std::vector<int64_t> skipped(table.ignored().size(), 0);
  int64_t derived = 0;
  int64_t max_layer = -1;  // the highest layer index among the unused tensors
  for (const std::string& n : ck.names()) {
    if (used.count(n)) continue;
    if (is_derived_buffer(n)) {
      ++derived;
      continue;
    }
    bool ignored = false;
    for (size_t k = 0; k < skipped.size() && !ignored; ++k)
      if (n.compare(0, table.ignored()[k].first.size(), table.ignored()[k].first) == 0) ignored = (++skipped[k], true);
    if (ignored) continue;
    if (n == "lm_head.weight" && spec.tie_embeddings) {
      // transformers ties the output layer to the embedding after loading, so the embedding is what
      // runs; a copy identical to it is what tied checkpoints often carry and is not worth a word.
      const TensorEntry& lm = ck.get(n);
      const TensorEntry& emb = ck.get(embedding);
      if (lm.dtype != emb.dtype || lm.shape != emb.shape || std::memcmp(lm.data, emb.data, lm.nbytes) != 0)
        warn(dir + ": tensor 'lm_head.weight' differs from the embedding but tie_word_embeddings is true, so it is "
                   "ignored and the embedding is the output layer (as in transformers)");
      continue;
    }
    unused.push_back(n);
    const std::string prefix = "model.layers.";
    if (n.compare(0, prefix.size(), prefix) == 0) {
      const size_t end = n.find('.', prefix.size());
      const std::string idx = n.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
      if (!idx.empty() && idx.size() < 10 && idx.find_first_not_of("0123456789") == std::string::npos)
        max_layer = std::max(max_layer, int64_t(std::stoll(idx)));
    }
  }
  if (derived > 0)
    warn(dir + ": " + std::to_string(derived) +
         " tensor(s) named '*rotary_emb.inv_freq' are ignored (recomputed from config.json's rope settings)");
  for (size_t k = 0; k < skipped.size(); ++k)
    if (skipped[k] > 0)
      warn(dir + ": " + std::to_string(skipped[k]) + " tensor(s) under '" + table.ignored()[k].first + "' are skipped (" +
           table.ignored()[k].second + ")");
  if (unused.empty()) return;
  std::string list;
  const size_t shown = std::min<size_t>(unused.size(), 5);
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + unused[i];
  if (unused.size() > shown) list += " and " + std::to_string(unused.size() - shown) + " more";
  std::string hint;
  if (max_layer >= spec.layers)
    hint = "; the checkpoint has layers up to model.layers." + std::to_string(max_layer) +
           " but num_hidden_layers is " + std::to_string(spec.layers);
  throw Error(dir + ": config.json and the checkpoint disagree: " + std::to_string(unused.size()) +
              " checkpoint tensor(s) are not used by the " + spec.family + " model the config describes: " + list +
              hint);
}

// Stores `t` (a weight [out, in] in the engine dtype) under `name` as INT4: packed values and scales.
void put_int4(Engine& eng, const std::string& name, const HostTensor& t, int64_t group, const float* clip) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  std::vector<float> f(size_t(t.numel()));
  const size_t es = dtype_size(t.dtype());
  parallel_ranges(int64_t(f.size()), int64_t(1) << 20, [&](int64_t b, int64_t e) {
    convert_to_f32(t.dtype(), static_cast<const uint8_t*>(t.data()) + size_t(b) * es, f.data() + b, size_t(e - b));
  });
  HostTensor packed(DType::U8, int4_packed_shape(t.shape()));
  HostTensor scales(eng.weight_dtype, int4_scales_shape(t.shape(), group));
  quantize_int4(f.data(), rows, cols, group, eng.weight_dtype, packed.as<uint8_t>(), scales.data(), clip);
  eng.weights.insert_or_assign(name, std::move(packed));
  eng.weights.insert_or_assign(name + kInt4ScalesSuffix, std::move(scales));
}

}  // namespace

void quantize_engine_int4(Engine& eng, int64_t group, const std::string& flag, bool lm_head,
                          const std::map<std::string, std::vector<float>>* clip) {
  if (eng.quant) throw Error(flag + ": the engine is already quantized");
  const WeightTable table = weight_table(eng.spec);
  QuantConfig q = plan_int4(table, group, flag, lm_head);
  for (const std::string& name : q.tensors) {
    const HostTensor t = std::move(eng.weights.at(name));
    const float* c = nullptr;
    if (clip)
      if (auto it = clip->find(name); it != clip->end()) {
        if (int64_t(it->second.size()) != t.shape()[0] * (t.shape()[1] / group))
          throw Error("quantize_engine_int4: " + std::to_string(it->second.size()) + " clip ratios for weight '" + name +
                      "' " + shape_str(t.shape()) + " in groups of " + std::to_string(group));
        c = it->second.data();
      }
    put_int4(eng, name, t, group, c);
  }
  eng.provenance["quantization"] = quant_json(&q, eng.weight_dtype);
  eng.quant = std::move(q);
}

std::map<std::string, std::pair<Shape, DType>> engine_tensor_shapes(const ModelSpec& s, DType dt, const QuantConfig* q) {
  std::map<std::string, std::pair<Shape, DType>> shapes;
  const WeightTable table = weight_table(s);
  std::map<std::string, const WeightSpec*> specs;
  for (const WeightSpec& w : table.entries()) {
    shapes[w.name] = {w.shape, w.dtype(dt)};
    specs[w.name] = &w;
  }
  if (!q) return shapes;
  for (const std::string& name : q->tensors) {
    auto it = shapes.find(name);
    if (it == shapes.end() || !int4_allowed(*specs.at(name)))
      throw Error("INT4 weight '" + name + "' is not a linear weight of this architecture");
    const Shape full = it->second.first;
    const int64_t group = q->group(full[1]);
    it->second = {int4_packed_shape(full), DType::U8};
    shapes[name + kInt4ScalesSuffix] = {int4_scales_shape(full, group), dt};
    if (!q->symmetric) shapes[name + kInt4ZerosSuffix] = {int4_scales_shape(full, group), DType::U8};
    if (q->act_order) shapes[name + kInt4PermSuffix] = {Shape{full[1]}, DType::I32};
  }
  return shapes;
}

Engine build_engine(const std::string& dir, const BuildOptions& o) {
  ModelSpec spec = load_model_spec(dir);
  const WeightTable table = weight_table(spec);
  Checkpoint ck(dir);

  // Every source tensor present with its shape and a floating dtype, and none left over, before any
  // conversion work.
  // A published INT4 checkpoint (quantization_config): its linear modules hold packed tensors in
  // place of ".weight", checked here with the rest and converted exactly into the runtime layout.
  const std::optional<PublishedQuant> published = read_published_quant(dir);
  if (published && o.int4_group_size)
    throw Error("--quantize: " + dir + " is already quantized (config.json quantization_config: " + published->method +
                "); build it without --quantize");
  std::optional<QuantConfig> quant;
  if (published) {
    quant = QuantConfig{};
    quant->method = published->method;
    quant->format = published->format;
    quant->group_size = published->group_size;
    quant->symmetric = published->symmetric;
    quant->act_order = published->act_order;
  }
  std::vector<std::vector<Source>> parts;  // [table entries][sources]; empty for a published INT4 weight
  std::vector<bool> is_published(table.entries().size(), false);
  std::set<std::string> used;  // checkpoint tensors the table reads
  uint64_t total = 0, done = 0;
  for (const WeightSpec& w : table.entries()) {
    std::vector<Source>& sources = parts.emplace_back();
    for (const WeightSource& src : w.sources) used.insert(src.hf_name);
    if (published && published_quantized(*published, ck, w)) {
      check_published(*published, ck, w);
      is_published[parts.size() - 1] = true;
      quant->tensors.push_back(w.name);
      for (const WeightSource& src : w.sources) {
        const std::string prefix = src.hf_name.substr(0, src.hf_name.size() - std::string(".weight").size());
        for (const std::string& n : published_tensor_names(*published, prefix))
          if (ck.has(n)) {
            used.insert(n);
            total += ck.get(n).nbytes;
          }
        // AutoGPTQ saves a bias for every quantized module, zeros where the model has none.
        const std::string bias = prefix + ".bias";
        if (ck.has(bias) && !std::any_of(table.entries().begin(), table.entries().end(), [&](const WeightSpec& e) {
              return std::any_of(e.sources.begin(), e.sources.end(), [&](const WeightSource& b) { return b.hf_name == bias; });
            })) {
          const TensorEntry& b = ck.get(bias);
          std::vector<float> v(size_t(numel(b.shape)));
          if (b.dtype != DType::F32 && b.dtype != DType::F16 && b.dtype != DType::BF16)
            throw Error(dir + ": tensor '" + bias + "' has dtype " + std::string(dtype_name(b.dtype)) + ", expected a floating type");
          convert_to_f32(b.dtype, b.data, v.data(), v.size());
          if (std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; }))
            throw Error(dir + ": tensor '" + bias + "' is not zero, but the " + spec.family + " model has no bias there");
          used.insert(bias);
        }
      }
      continue;
    }
    for (const WeightSource& src : w.sources) {
      const TensorEntry& e = ck.get(src.hf_name);
      if (e.shape != src.shape)
        throw Error(dir + ": tensor '" + src.hf_name + "' has shape " + shape_str(e.shape) + ", expected " +
                    shape_str(src.shape));
      if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16)
        throw Error(dir + ": tensor '" + src.hf_name + "' has dtype " + std::string(dtype_name(e.dtype)) +
                    ", expected a floating type (F32, F16, BF16)");
      sources.push_back(Source{e.view(), src.hf_name});
      total += sources.back().view.nbytes();
    }
  }
  const auto warn = o.warn ? o.warn : [](const std::string& line) { std::fprintf(stderr, "warning: %s\n", line.c_str()); };
  check_unused(dir, spec, ck, table, std::move(used), warn);

  if (published && quant->tensors.empty())
    throw Error(dir + ": config.json has a quantization_config (" + published->method + ") but no linear weight holds '" +
                published_tensor_names(*published, "<module>")[0] + "' tensors");
  if (published) {  // whole rows (and other groups) re-expressed as groups every backend's kernels take
    quant->group_size = int4_runtime_group(published->group_size, int4_quantizable_cols(table));
    if (quant->group_size != published->group_size) quant->published_group = published->group_size;
  }

  Engine eng;
  eng.spec = spec;
  eng.weight_dtype = build_dtype(dir, spec, o.dtype);
  if (o.quantize_lm_head && !o.int4_group_size) throw Error("--quantize-lm-head needs --quantize int4");
  if (o.int4_group_size) quant = plan_int4(table, *o.int4_group_size, "--group-size", o.quantize_lm_head);
  // A sink (a tensor-parallel rank's own build) takes plain weights only: INT4 ones are split from the
  // whole engine (shard_engine).
  if (o.sink && quant)
    throw Error(dir + ": INT4 weights cannot be built one rank's share at a time; build the whole engine and split "
                      "it (docs/tensor-parallel.md)");
  bool rounded = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightSpec& w = table.entries()[i];
    if (is_published[i]) {
      Int4Parts p = convert_published(*published, ck, w, eng.weight_dtype, quant->group(w.shape.at(1)), &rounded);
      eng.weights.insert_or_assign(w.name, std::move(p.packed));
      eng.weights.insert_or_assign(w.name + kInt4ScalesSuffix, std::move(p.scales));
      if (p.zeros) eng.weights.insert_or_assign(w.name + kInt4ZerosSuffix, std::move(*p.zeros));
      if (p.perm) eng.weights.insert_or_assign(w.name + kInt4PermSuffix, std::move(*p.perm));
      for (const WeightSource& src : w.sources)
        for (const std::string& n : published_tensor_names(*published, src.hf_name.substr(0, src.hf_name.size() - std::string(".weight").size())))
          if (ck.has(n)) done += ck.get(n).nbytes;
      if (o.progress) o.progress(done, total);
      continue;
    }
    HostTensor t = stack_rows(parts[i], w, eng.weight_dtype, dir);
    // One weight at a time, so the 16-bit copy of the whole model never coexists with the INT4 one.
    // (A published checkpoint's plain linear weights, modules it left unquantized, stay as they are.)
    const bool to_int4 = quant && !published &&
                         std::find(quant->tensors.begin(), quant->tensors.end(), w.name) != quant->tensors.end();
    if (to_int4) put_int4(eng, w.name, t, quant->group_size, nullptr);
    else if (o.sink) o.sink(eng, w, std::move(t));  // t, the whole weight, goes at the end of this step
    else eng.weights.emplace(w.name, std::move(t));
    for (const Source& p : parts[i]) done += p.view.nbytes();
    if (o.progress) o.progress(done, total);
  }
  if (rounded)
    warn(dir + ": the checkpoint's INT4 scales do not all fit " + std::string(dtype_name(eng.weight_dtype)) +
         " exactly and were rounded to it; build with --dtype f16 or f32 to keep them exact");
  eng.quant = std::move(quant);
  eng.provenance = {{"checkpoint", dir}, {"files", ck.files()}, {"dtype", std::string(dtype_name(eng.weight_dtype))}};
  if (eng.quant) eng.provenance["quantization"] = quant_json(&*eng.quant, eng.weight_dtype);
  return eng;
}

DType build_dtype(const std::string& dir, const ModelSpec& spec, std::optional<DType> requested) {
  if (requested) return *requested;
  if (spec.torch_dtype == "float32") return DType::F32;
  if (spec.torch_dtype == "float16") return DType::F16;
  if (spec.torch_dtype == "bfloat16") return DType::BF16;
  return Checkpoint(dir).get(weight_table(spec).entries().front().sources.front().hf_name).dtype;
}

Engine random_engine(const ModelSpec& spec, DType dt, uint64_t seed, const WeightSink& sink) {
  Engine eng;
  eng.spec = spec;
  eng.weight_dtype = dt;
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const WeightTable table = weight_table(spec);
  for (const WeightSpec& w : table.entries()) {
    // Each weight's own generator, seeded by (seed, name): its values do not depend on the weights
    // made before it, so one rank can make any weight alone (tp_split.h, random_rank_engine).
    std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (fnv1a64(w.name) | 1)));
    normal.reset();
    const DType wdt = w.dtype(dt);
    HostTensor t(wdt, w.shape);
    const size_t n = size_t(t.numel());
    std::vector<float> buf(std::min<size_t>(n, 1 << 16));
    // Cheap fill: a block of random values repeated, each repetition rotated by its own offset (an odd
    // stride), so that a wide matrix's rows do not repeat. Unrotated, the LM head of Qwen3-0.6B had 64
    // distinct rows (Qwen3-8B's 16): the logits tied in groups of thousands of tokens, a worst case for
    // sampling that no trained model presents. Two rows can now coincide only when their blocks are a
    // multiple of gcd(block, row width) apart (the stride is odd): at most three copies of a row in a
    // 152k-token LM head of width 1024 (2,374 blocks) or 4096 (9,496 blocks).
    for (float& v : buf) v = w.init == WeightInit::Ones ? 1.0f : normal(rng);
    const size_t es = dtype_size(wdt);
    auto* dst = static_cast<uint8_t*>(t.data());
    const int64_t reps = int64_t((n + buf.size() - 1) / buf.size());
    parallel_ranges(reps, 16, [&](int64_t r0, int64_t r1) {  // repetitions are independent
      for (size_t rep = size_t(r0); rep < size_t(r1); ++rep) {
        const size_t i = rep * buf.size();
        const size_t c = std::min(buf.size(), n - i), off = (rep * 40503) % buf.size();
        const size_t head = std::min(c, buf.size() - off);  // buf[off, off + head), then buf[0, c - head)
        convert_from_f32(wdt, buf.data() + off, dst + i * es, head);
        if (c > head) convert_from_f32(wdt, buf.data(), dst + (i + head) * es, c - head);
      }
    });
    if (sink) sink(eng, w, std::move(t));
    else eng.weights.emplace(w.name, std::move(t));
  }
  eng.provenance = {{"random_seed", seed}, {"dtype", std::string(dtype_name(dt))}};
  return eng;
}

}  // namespace ingot
