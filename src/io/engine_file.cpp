// Engine file writing, parsing and loading (format: docs/engine-format.md). Parsing trusts nothing:
// the header, the metadata's every field and the tensor table are checked against each other and
// against the file size before a blob is read, so a damaged or hostile file gives an Error naming
// the problem, never a crash or a silently different model.
#include "io/engine_file.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "core/mapped_file.h"
#include "core/revision.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "models/state_layout.h"
#include "models/tp_spec.h"

namespace ingot {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kHashChunk = 16ull << 20;  // progress granularity of hashing

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

// Weight dtypes an engine may hold, by the names dtype_name() writes.
bool parse_weight_dtype(const std::string& s, DType& out) {
  for (DType d : {DType::F32, DType::F16, DType::BF16})
    if (s == dtype_name(d)) {
      out = d;
      return true;
    }
  return false;
}

// Absent is fine (the file is optional); present but unreadable (e.g. a directory) is an error.
std::optional<std::string> read_text_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return std::nullopt;
  return read_file(p.string());
}

json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where + ": not valid JSON: " + e.what());
  }
}

// ---- metadata field access: every error names the file and the field's dotted path ----

class Fields {
 public:
  explicit Fields(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(file_ + ": metadata field '" + path + "' " + what);
  }
  const json& field(const json& obj, const std::string& path, const std::string& key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(path, "is missing");
    return *it;
  }
  const json& object(const json& obj, const std::string& path, const std::string& key) const {
    const json& v = field(obj, path, key);
    if (!v.is_object()) fail(path, "must be an object");
    return v;
  }
  const json& array(const json& obj, const std::string& path, const std::string& key) const {
    const json& v = field(obj, path, key);
    if (!v.is_array()) fail(path, "must be an array");
    return v;
  }
  int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(path, "must be an integer");
    const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi);
    const int64_t x = too_big ? hi : v.get<int64_t>();
    if (too_big || x < lo || x > hi)
      fail(path, "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    return x;
  }
  int64_t integer(const json& obj, const std::string& path, const std::string& key, int64_t lo, int64_t hi) const {
    return integer(field(obj, path, key), path, lo, hi);
  }
  uint64_t unsigned_(const json& obj, const std::string& path, const std::string& key) const {
    const json& v = field(obj, path, key);
    if (!v.is_number_unsigned()) fail(path, "must be a non-negative integer");
    return v.get<uint64_t>();
  }
  double number(const json& obj, const std::string& path, const std::string& key) const {
    const json& v = field(obj, path, key);
    if (!v.is_number()) fail(path, "must be a number");
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(path, "must be finite");
    return d;
  }
  bool boolean(const json& obj, const std::string& path, const std::string& key) const {
    const json& v = field(obj, path, key);
    if (!v.is_boolean()) fail(path, "must be true or false");
    return v.get<bool>();
  }
  std::string string(const json& obj, const std::string& path, const std::string& key) const {
    const json& v = field(obj, path, key);
    if (!v.is_string()) fail(path, "must be a string");
    return v.get<std::string>();
  }
  std::optional<std::string> optional_string(const json& obj, const std::string& path, const std::string& key) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) fail(path, "must be a string or null");
    return it->get<std::string>();
  }
  void integer_list(const json& obj, const std::string& path, const std::string& key, int64_t lo, int64_t hi,
                    size_t max_len) const {
    const json& a = array(obj, path, key);
    if (a.size() > max_len) fail(path, "has " + std::to_string(a.size()) + " entries, more than " + std::to_string(max_len));
    for (size_t i = 0; i < a.size(); ++i) integer(a[i], path + "[" + std::to_string(i) + "]", lo, hi);
  }

 private:
  std::string file_;
};

// Limits of a plausible decoder-only model. They keep a hostile file from making the loader
// enumerate billions of layers or allocate absurd tables; real models sit far inside them.
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxHidden = int64_t(1) << 17;
constexpr int64_t kMaxIntermediate = int64_t(1) << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxPositions = int64_t(1) << 30;

// Checks the architecture block's types and ranges, then reads it with spec_from_json (which
// expects well-typed fields) and checks what relates fields to each other.
ModelSpec parse_architecture(const Fields& f, const json& a) {
  const std::string p = "architecture.";
  f.string(a, p + "family", "family");
  f.integer(a, p + "vocab", "vocab", 1, kMaxVocab);
  f.integer(a, p + "hidden", "hidden", 1, kMaxHidden);
  f.integer(a, p + "intermediate", "intermediate", 1, kMaxIntermediate);
  const int64_t layers = f.integer(a, p + "layers", "layers", 1, kMaxLayers);
  f.integer(a, p + "heads", "heads", 1, kMaxHeads);
  f.integer(a, p + "kv_heads", "kv_heads", 1, kMaxHeads);
  f.integer(a, p + "head_dim", "head_dim", 1, kMaxHeadDim);
  f.integer(a, p + "max_position", "max_position", 1, kMaxPositions);
  f.number(a, p + "rms_eps", "rms_eps");
  for (const char* k : {"tie_embeddings", "qkv_bias", "o_bias", "qk_norm"}) f.boolean(a, p + k, k);
  f.integer_list(a, p + "window", "window", 0, kMaxPositions, size_t(layers));
  f.integer_list(a, p + "eos_ids", "eos_ids", 0, kMaxVocab, 64);
  if (a.contains("torch_dtype")) f.string(a, p + "torch_dtype", "torch_dtype");
  if (a.contains("bos_id")) f.integer(a, p + "bos_id", "bos_id", 0, kMaxVocab);
  const json& r = f.object(a, p + "rope", "rope");
  const std::string rp = p + "rope.";
  f.string(r, rp + "type", "type");
  for (const char* k : {"theta", "factor", "partial_rotary_factor", "low_freq_factor", "high_freq_factor", "beta_fast",
                        "beta_slow"})
    f.number(r, rp + k, k);
  f.integer(r, rp + "original_max_position", "original_max_position", 0, kMaxPositions);
  f.boolean(r, rp + "truncate", "truncate");
  for (const char* k : {"attention_factor", "mscale", "mscale_all_dim"})
    if (r.contains(k)) f.number(r, rp + k, k);

  ModelSpec s;
  try {
    s = spec_from_json(a);
  } catch (const Error& e) {
    f.fail("architecture", std::string("is malformed: ") + e.what());
  }
  try {
    find_family(s.family);
  } catch (const Error& e) {
    f.fail(p + "family", e.what());
  }
  if (s.heads % s.kv_heads != 0)
    f.fail(p + "heads", std::to_string(s.heads) + " is not a multiple of kv_heads " + std::to_string(s.kv_heads));
  if (int64_t(s.window.size()) != s.layers)
    f.fail(p + "window", "must list one entry per layer (" + std::to_string(s.layers) + ")");
  for (int64_t e : s.eos_ids)
    if (e >= s.vocab) f.fail(p + "eos_ids", "holds id " + std::to_string(e) + " outside the vocabulary");
  if (s.bos_id && *s.bos_id >= s.vocab) f.fail(p + "bos_id", "lies outside the vocabulary");
  static const std::set<std::string> kRope = {"default", "linear", "llama3", "yarn"};
  if (!kRope.count(s.rope.type)) f.fail(rp + "type", "'" + s.rope.type + "' is not supported");
  if (!(s.rope.theta > 0)) f.fail(rp + "theta", "must be positive");
  if (!(s.rope.factor > 0)) f.fail(rp + "factor", "must be positive");
  if (!(s.rope.partial_rotary_factor > 0 && s.rope.partial_rotary_factor <= 1))
    f.fail(rp + "partial_rotary_factor", "must lie in (0, 1]");
  if (s.rope_dim() % 2 != 0 || s.rope_dim() < 2) f.fail(rp + "partial_rotary_factor", "gives an odd or empty rotary dimension");
  if (!(s.rms_eps > 0)) f.fail(p + "rms_eps", "must be positive");
  return s;
}

void check_bounds(const std::string& where, int max_batch, int64_t capacity) {
  if (max_batch < 1 || max_batch > kMaxBatch)
    throw Error(where + "max batch " + std::to_string(max_batch) + " must lie in [1, " + std::to_string(kMaxBatch) + "]");
  if (capacity < 1 || capacity > kMaxCapacity)
    throw Error(where + "capacity " + std::to_string(capacity) + " must lie in [1, " + std::to_string(kMaxCapacity) + "]");
}

std::string cuda_requirement_reason(DType dt) {
  return dt == DType::BF16 ? "bf16 weights" : std::string(dtype_name(dt)) + " weights";
}

// A tensor record's dtype: a weight dtype, or u8 (packed INT4 values, quant/int4.h).
bool parse_tensor_dtype(const std::string& s, DType& out) {
  if (s == dtype_name(DType::U8)) {
    out = DType::U8;
    return true;
  }
  if (s == dtype_name(DType::I32)) {  // an act-order permutation (<name>.perm)
    out = DType::I32;
    return true;
  }
  return parse_weight_dtype(s, out);
}

// weights.quantization: "none" (nullopt), or INT4 as quant_json writes it, every field checked against
// what this version runs and the architecture's table (a listed tensor must be a quantizable weight
// whose input dimension the group size divides).
std::optional<QuantConfig> parse_quantization(const Fields& f, const json& w, const ModelSpec& s, DType wdt) {
  const json& q = f.field(w, "weights.quantization", "quantization");
  if (q.is_string()) {
    if (q.get<std::string>() != "none")
      f.fail("weights.quantization", "'" + q.get<std::string>() + "' is not supported by this version (\"none\" or an INT4 object)");
    return std::nullopt;
  }
  if (!q.is_object()) f.fail("weights.quantization", "must be \"none\" or an object");
  const std::string p = "weights.quantization.";
  QuantConfig c;
  c.method = f.string(q, p + "method", "method");
  if (!int4_method_known(c.method))
    f.fail(p + "method", "'" + c.method + "' is not supported by this version (rtn, gptq, awq, compressed-tensors)");
  const bool rtn = c.method == "rtn";
  c.bits = int(f.integer(q, p + "bits", "bits", 4, 4));
  c.group_size = f.integer(q, p + "group_size", "group_size", -1, int64_t(1) << 30);
  if (rtn && (c.group_size < kInt4MinGroup || c.group_size > kInt4MaxGroup))
    f.fail(p + "group_size", "must lie in [" + std::to_string(kInt4MinGroup) + ", " + std::to_string(kInt4MaxGroup) +
                                 "] for rtn");
  if (rtn && (c.group_size & (c.group_size - 1)) != 0) f.fail(p + "group_size", "must be a power of two for rtn");
  if (c.group_size != -1 && (c.group_size < 2 || c.group_size % 2 != 0))
    f.fail(p + "group_size", "must be -1 (whole row) or an even size >= 2");
  // Present where a published checkpoint's groups were re-expressed (int4_runtime_group).
  if (q.contains("published_group_size")) {
    c.published_group = f.integer(q, p + "published_group_size", "published_group_size", -1, int64_t(1) << 30);
    if (rtn) f.fail(p + "published_group_size", "is for a published method, not rtn");
    if (c.published_group != -1 && (c.published_group < 2 || c.published_group % 2 != 0 ||
                                    (c.group_size > 0 && c.published_group % c.group_size != 0)))
      f.fail(p + "published_group_size", "must be -1 (whole row) or an even multiple of group_size");
  }
  c.symmetric = f.boolean(q, p + "symmetric", "symmetric");
  if (rtn && !c.symmetric) f.fail(p + "symmetric", "must be true for rtn (round to nearest writes no zero points)");
  // Absent in the files of the first INT4 version, which had no act-order.
  c.act_order = q.contains("act_order") ? f.boolean(q, p + "act_order", "act_order") : false;
  if (rtn && c.act_order) f.fail(p + "act_order", "must be false for rtn");
  if (q.contains("format")) {
    c.format = f.string(q, p + "format", "format");
    const bool ok = (c.method == "gptq" && (c.format == "gptq" || c.format == "gptq_v2")) ||
                    (c.method == "awq" && c.format == "gemm") ||
                    (c.method == "compressed-tensors" && c.format == "pack-quantized");
    if (!ok) f.fail(p + "format", "'" + c.format + "' is not a format of method '" + c.method + "'");
  } else if (!rtn) {
    f.fail(p + "format", "is missing (a published method records its checkpoint format)");
  }
  if (f.string(q, p + "layout", "layout") != "int4_rows_low_nibble_first")
    f.fail(p + "layout", "must be \"int4_rows_low_nibble_first\"");
  const std::string sdt = f.string(q, p + "scale_dtype", "scale_dtype");
  if (sdt != dtype_name(wdt)) f.fail(p + "scale_dtype", "'" + sdt + "' is not the weights' dtype " + std::string(dtype_name(wdt)));
  const json& names = f.array(q, p + "tensors", "tensors");
  if (names.empty()) f.fail(p + "tensors", "must list at least one tensor");
  const WeightTable table = weight_table(s);
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string pi = p + "tensors[" + std::to_string(i) + "]";
    if (!names[i].is_string()) f.fail(pi, "must be a string");
    const std::string n = names[i].get<std::string>();
    auto it = std::find_if(table.entries().begin(), table.entries().end(), [&](const WeightSpec& e) { return e.name == n; });
    if (it == table.entries().end() || !int4_allowed(*it))
      f.fail(pi, "'" + n + "' is not a weight of this architecture that can be INT4");
    if (c.group_size > 0 && it->shape[1] % c.group_size != 0)
      f.fail(pi, "'" + n + "' has input dimension " + std::to_string(it->shape[1]) + ", which group_size " +
                     std::to_string(c.group_size) + " does not divide");
    if (!seen.insert(n).second) f.fail(pi, "'" + n + "' is listed twice");
    c.tensors.push_back(n);
  }
  return c;
}

}  // namespace

bool parse_xxh64_hex(const std::string& s, uint64_t& out) {
  if (s.size() != 16) return false;
  out = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    out = (out << 4) | uint64_t(d);
  }
  return true;
}

uint64_t xxh64_of(const uint8_t* p, uint64_t n, const std::function<void(uint64_t)>& tick) {
  XXH64_state_t* st = XXH64_createState();
  if (!st) throw std::bad_alloc();
  XXH64_reset(st, 0);
  for (uint64_t at = 0; at < n; at += kHashChunk) {
    const uint64_t c = std::min(kHashChunk, n - at);
    XXH64_update(st, p + at, size_t(c));
    if (tick) tick(c);
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

std::string xxh64_hex(uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

json kv_cache_json(const ModelSpec& s, const CacheBounds& b) {
  const KvShape k = kv_shape(s, b);
  json j = {{"layout", layout_name(b.layout)}, {"tensors_per_layer", json::array({"k", "v"})}, {"layers", s.layers},
            {"axes", k.axes}, {"shape", k.shape}, {"capacity_axis", k.capacity_axis}};
  if (!s.has_linear_layers()) return j;
  // A hybrid model: K/V only in its attention layers; the linear layers' state (f32) beside them.
  json attention = json::array(), linear = json::array();
  for (int64_t l = 0; l < s.layers; ++l) (s.kind(l) == LayerKind::Linear ? linear : attention).push_back(l);
  j["layers"] = attention.size();
  j["attention_layers"] = attention;
  const LinearStateShape ls = linear_state_shape(s, b.max_batch);
  j["linear_state"] = {{"layers", linear},
                       {"dtype", "f32"},
                       {"conv", {{"shape", ls.conv}, {"axes", {"batch", "conv_channels", "kernel-1"}}}},
                       {"recurrent", {{"shape", ls.recurrent}, {"axes", {"batch", "v_heads", "k_dim", "v_dim"}}}}};
  return j;
}

std::pair<int, int> min_cuda_capability(DType dt) { return dt == DType::BF16 ? std::pair{8, 0} : std::pair{7, 0}; }

// ---------------------------------------------------------------------------------------------
// Building

std::vector<std::string> checkpoint_files(const std::string& dir) {
  const fs::path d(dir);
  std::set<std::string> names = {"config.json"};
  for (const char* n : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "chat_template.jinja", "chat_template.json", "model.safetensors.index.json"})
    if (fs::is_regular_file(d / n)) names.insert(n);
  {
    Checkpoint ck(dir);
    for (const std::string& f : ck.files()) names.insert(fs::path(f).filename().string());
  }
  std::vector<std::string> out;
  for (const std::string& n : names) out.push_back((d / n).string());
  return out;
}

CheckpointExtras describe_checkpoint(const std::string& dir, const ProgressFn& progress) {
  CheckpointExtras x;
  x.dir = dir;
  const fs::path d(dir);

  x.tokenizer_json = read_text_file(d / "tokenizer.json");
  x.tokenizer_config_json = read_text_file(d / "tokenizer_config.json");
  x.special_tokens_map_json = read_text_file(d / "special_tokens_map.json");
  if (auto t = read_text_file(d / "chat_template.jinja")) {
    x.chat_template = std::move(t);
  } else if (auto cj = read_text_file(d / "chat_template.json")) {
    json j = parse_json_text(*cj, (d / "chat_template.json").string());
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      x.chat_template = j["chat_template"].get<std::string>();
  } else if (x.tokenizer_config_json) {
    json j = parse_json_text(*x.tokenizer_config_json, (d / "tokenizer_config.json").string());
    if (j.is_object() && j.contains("chat_template")) {
      const json& t = j["chat_template"];
      if (t.is_string()) {
        x.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // named templates: the runtime uses the one called "default"
        for (const json& e : t)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
            x.chat_template = e["template"].get<std::string>();
      }
    }
  }
  if (auto g = read_text_file(d / "generation_config.json")) {
    x.generation_defaults = parse_json_text(*g, (d / "generation_config.json").string());
    if (!x.generation_defaults.is_object()) throw Error((d / "generation_config.json").string() + ": not a JSON object");
  }

  std::vector<std::pair<std::string, std::unique_ptr<MappedFile>>> maps;
  uint64_t total = 0, done = 0;
  for (const std::string& path : checkpoint_files(dir)) {
    maps.emplace_back(fs::path(path).filename().string(), std::make_unique<MappedFile>(path));
    total += maps.back().second->size();
  }
  for (auto& [n, m] : maps) {
    const uint64_t h = xxh64_of(m->data(), m->size(), [&](uint64_t c) {
      done += c;
      if (progress) progress(done, total);
    });
    x.files.push_back({n, m->size(), h});
  }
  return x;
}

void save_engine(const Engine& eng, const EngineBuildInfo& info, const std::string& path, const ProgressFn& progress) {
  const ModelSpec& s = eng.spec;
  const std::string where = path + ": ";
  const auto expect = engine_tensor_shapes(s, eng.weight_dtype, eng.quant ? &*eng.quant : nullptr);
  for (auto& [name, want] : expect) {
    const HostTensor* t = eng.find(name);
    if (!t) throw Error(where + "the engine has no weight '" + name + "'");
    if (t->shape() != want.first)
      throw Error(where + "engine weight '" + name + "' has shape " + shape_str(t->shape()) + ", the spec implies " +
                  shape_str(want.first));
    if (t->dtype() != want.second)
      throw Error(where + "engine weight '" + name + "' is " + std::string(dtype_name(t->dtype())) + ", the spec implies " +
                  std::string(dtype_name(want.second)));
  }
  for (auto& [name, t] : eng.weights)
    if (!expect.count(name)) throw Error(where + "the engine holds weight '" + name + "' that its spec does not use");
  DType wdt;
  if (!parse_weight_dtype(std::string(dtype_name(eng.weight_dtype)), wdt))
    throw Error(where + "weight dtype " + std::string(dtype_name(eng.weight_dtype)) + " cannot be stored in an engine");
  CacheBounds bounds = info.bounds;
  if (!bounds.capacity) bounds.capacity = default_capacity(s);  // the rule of `ingot build` and of runs
  check_bounds(where, bounds.max_batch, bounds.capacity);
  if (info.tp_world_size < 1 || info.tp_rank < 0 || info.tp_rank >= info.tp_world_size)
    throw Error(where + "tensor-parallel rank " + std::to_string(info.tp_rank) + " of world size " +
                std::to_string(info.tp_world_size) + " is not valid");
  // One rank's slice: the architecture stored is the whole model's, and the slice must be its rank's.
  const ModelSpec& arch = info.tp_world_size > 1 ? info.whole_spec.value_or(ModelSpec{}) : s;
  if (info.tp_world_size > 1) {
    if (!info.whole_spec) throw Error(where + "a tensor-parallel rank's engine needs the whole model's spec");
    if (info.build_id.empty()) throw Error(where + "a tensor-parallel rank's engine needs a build id");
    const ModelSpec want = rank_spec(*info.whole_spec, info.tp_world_size, info.tp_rank);
    if (spec_to_json(want) != spec_to_json(s) || want.tp.world != s.tp.world || want.tp.rank != s.tp.rank ||
        want.tp.vocab_rows != s.tp.vocab_rows)
      throw Error(where + "the engine is not rank " + std::to_string(info.tp_rank) + " of " +
                  std::to_string(info.tp_world_size) + "'s slice of the model given as whole_spec");
  } else if (s.tp.world > 1) {
    throw Error(where + "the engine is one rank's slice; save it with its tp_world_size, tp_rank and whole_spec");
  }

  // Hash the blobs first: the metadata that precedes them carries their checksums.
  std::vector<std::pair<const std::string*, const HostTensor*>> order;
  for (auto& [name, t] : eng.weights) order.emplace_back(&name, &t);
  std::vector<uint64_t> hashes(order.size());
  uint64_t total = 0;
  for (auto& o : order) total += o.second->nbytes();
  for (size_t i = 0; i < order.size(); ++i)
    hashes[i] = XXH64(order[i].second->data(), order[i].second->nbytes(), 0);

  json m;
  m["tool"] = {{"name", "ingot"}, {"version", INGOT_VERSION}, {"git_revision", git_revision()}};
  m["architecture"] = spec_to_json(arch);
  m["weights"] = {{"dtype", std::string(dtype_name(eng.weight_dtype))},
                  {"quantization", quant_json(eng.quant ? &*eng.quant : nullptr, eng.weight_dtype)},
                  {"count", order.size()},
                  {"bytes", total}};
  m["runtime"] = {{"max_batch", bounds.max_batch},
                  {"capacity", bounds.capacity},
                  {"layout", layout_name(bounds.layout)},
                  {"kv_cache", kv_cache_json(s, bounds)}};
  m["parallel"] = {{"tp_world_size", info.tp_world_size}, {"tp_rank", info.tp_rank}};
  if (info.tp_world_size > 1) m["parallel"]["build_id"] = info.build_id;
  const auto [cc_major, cc_minor] = min_cuda_capability(eng.weight_dtype);
  m["requirements"] = {{"cuda_min_capability", {cc_major, cc_minor}}, {"reason", cuda_requirement_reason(eng.weight_dtype)}};
  auto opt = [](const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); };
  const CheckpointExtras& x = info.source;
  m["tokenizer"] = {{"tokenizer.json", opt(x.tokenizer_json)},
                    {"tokenizer_config.json", opt(x.tokenizer_config_json)},
                    {"special_tokens_map.json", opt(x.special_tokens_map_json)},
                    {"chat_template", opt(x.chat_template)}};
  m["generation_defaults"] = x.generation_defaults.is_object() ? x.generation_defaults : json::object();
  json files = json::array();
  for (const SourceFile& f : x.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", xxh64_hex(f.xxh64)}});
  m["source"] = {{"checkpoint", x.dir}, {"files", files}};
  m["build_options"] = {{"dtype", info.requested_dtype ? json(std::string(dtype_name(*info.requested_dtype))) : json(nullptr)},
                        {"max_batch", info.bounds.max_batch},
                        {"capacity", info.bounds.capacity},
                        {"layout", layout_name(info.bounds.layout)}};

  // Offsets are absolute, so their digits feed back into the metadata length: settle by iterating
  // (the data offset only grows, in 256-byte steps, so this ends after a step or two).
  std::string text;
  uint64_t data_offset = align_up(kEngineHeaderBytes, kEngineAlignment);
  std::vector<uint64_t> offsets(order.size());
  for (;;) {
    uint64_t at = data_offset;
    json tensors = json::array();
    for (size_t i = 0; i < order.size(); ++i) {
      const HostTensor& t = *order[i].second;
      offsets[i] = at;
      tensors.push_back({{"name", *order[i].first},
                         {"dtype", std::string(dtype_name(t.dtype()))},
                         {"shape", t.shape()},
                         {"offset", at},
                         {"bytes", t.nbytes()},
                         {"xxh64", xxh64_hex(hashes[i])}});
      at = align_up(at + t.nbytes(), kEngineAlignment);
    }
    m["tensors"] = std::move(tensors);
    try {
      text = m.dump();
    } catch (const json::exception& e) {
      throw Error(where + "cannot encode the metadata (a tokenizer or config file is not valid UTF-8?): " + e.what());
    }
    const uint64_t need = align_up(kEngineHeaderBytes + text.size(), kEngineAlignment);
    if (need <= data_offset) break;
    data_offset = need;
  }
  if (text.size() > kEngineMaxMetadataBytes)
    throw Error(where + "metadata of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                std::to_string(kEngineMaxMetadataBytes));
  const uint64_t file_bytes = offsets.back() + order.back().second->nbytes();

  uint8_t header[kEngineHeaderBytes] = {};
  std::memcpy(header, kEngineMagic, 8);
  put_u32(header + 8, kEngineFormatVersion);
  put_u32(header + 12, 0);  // flags
  put_u64(header + 16, text.size());
  put_u64(header + 24, XXH64(text.data(), text.size(), 0));
  put_u64(header + 32, data_offset);
  put_u64(header + 40, file_bytes);

  OutputFile out(path);
  static const char zeros[kEngineAlignment] = {};
  out.write(header, kEngineHeaderBytes);
  out.write(text.data(), text.size());
  uint64_t pos = kEngineHeaderBytes + text.size();
  uint64_t done = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    out.write(zeros, size_t(offsets[i] - pos));
    const HostTensor& t = *order[i].second;
    const char* p = static_cast<const char*>(t.data());
    for (uint64_t at = 0; at < t.nbytes(); at += kHashChunk) {
      const uint64_t c = std::min<uint64_t>(kHashChunk, t.nbytes() - at);
      out.write(p + at, size_t(c));
      done += c;
      if (progress) progress(done, total);
    }
    pos = offsets[i] + t.nbytes();
  }
  out.commit();
}

// ---------------------------------------------------------------------------------------------
// Parsing

EngineFileInfo parse_engine_file(const uint8_t* data, size_t size, const std::string& name) {
  const std::string where = name + ": ";
  EngineFileInfo info;
  info.path = name;
  if (size < kEngineHeaderBytes)
    throw Error(where + "file of " + std::to_string(size) + " bytes is too short for the " +
                std::to_string(kEngineHeaderBytes) + "-byte engine header (truncated, or not an engine file)");
  if (std::memcmp(data, kEngineMagic, 8) != 0)
    throw Error(where + "not an ingot engine file (the first 8 bytes are not \"INGOTENG\")");
  info.format_version = get_u32(data + 8);
  if (info.format_version > kEngineFormatVersion)
    throw Error(where + "engine format version " + std::to_string(info.format_version) +
                " is newer than this ingot " INGOT_VERSION " reads (up to " + std::to_string(kEngineFormatVersion) +
                "): rebuild the engine with this ingot, or use a newer ingot");
  if (info.format_version == 0) throw Error(where + "engine format version 0 is not valid");
  const uint32_t flags = get_u32(data + 12);
  if (flags != 0) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", flags);
    throw Error(where + "header flags " + b + " are unknown to format version 1 (which defines none)");
  }
  for (size_t i = 48; i < kEngineHeaderBytes; ++i)
    if (data[i] != 0) throw Error(where + "reserved header bytes 48..63 are not zero");
  info.metadata_bytes = get_u64(data + 16);
  const uint64_t meta_hash = get_u64(data + 24);
  info.data_offset = get_u64(data + 32);
  info.file_bytes = get_u64(data + 40);
  if (size < info.file_bytes)
    throw Error(where + "file is truncated: it has " + std::to_string(size) + " bytes, its header says " +
                std::to_string(info.file_bytes));
  if (size > info.file_bytes)
    throw Error(where + "file has " + std::to_string(size - info.file_bytes) + " bytes beyond the " +
                std::to_string(info.file_bytes) + " its header declares");
  if (info.metadata_bytes > kEngineMaxMetadataBytes)
    throw Error(where + "metadata length " + std::to_string(info.metadata_bytes) + " exceeds the limit of " +
                std::to_string(kEngineMaxMetadataBytes) + " bytes");
  if (info.data_offset % kEngineAlignment != 0)
    throw Error(where + "data offset " + std::to_string(info.data_offset) + " is not a multiple of " +
                std::to_string(kEngineAlignment));
  if (info.data_offset > info.file_bytes)
    throw Error(where + "data offset " + std::to_string(info.data_offset) + " lies beyond the end of the file (" +
                std::to_string(info.file_bytes) + " bytes)");
  if (kEngineHeaderBytes + info.metadata_bytes > info.data_offset)
    throw Error(where + "metadata (" + std::to_string(info.metadata_bytes) + " bytes from offset " +
                std::to_string(kEngineHeaderBytes) + ") runs past the data offset " + std::to_string(info.data_offset));
  const uint8_t* meta = data + kEngineHeaderBytes;
  const uint64_t got_hash = XXH64(meta, size_t(info.metadata_bytes), 0);
  if (got_hash != meta_hash)
    throw Error(where + "metadata checksum mismatch (header says xxh64 " + xxh64_hex(meta_hash) + ", the bytes give " +
                xxh64_hex(got_hash) + "): the file is corrupt");
  json& m = info.metadata;
  try {
    m = json::parse(meta, meta + info.metadata_bytes);
  } catch (const json::exception& e) {
    throw Error(where + "metadata is not valid JSON: " + e.what());
  }
  if (!m.is_object()) throw Error(where + "metadata is not a JSON object");

  const Fields f(name);
  // tool
  const json& tool = f.object(m, "tool", "tool");
  f.string(tool, "tool.version", "version");
  f.string(tool, "tool.git_revision", "git_revision");
  // architecture
  info.spec = parse_architecture(f, f.object(m, "architecture", "architecture"));
  const ModelSpec& s = info.spec;
  // weights
  const json& w = f.object(m, "weights", "weights");
  const std::string wdt = f.string(w, "weights.dtype", "dtype");
  if (!parse_weight_dtype(wdt, info.weight_dtype)) f.fail("weights.dtype", "'" + wdt + "' is not f32, f16 or bf16");
  info.quant = parse_quantization(f, w, s, info.weight_dtype);
  // parallelism: a file holding one rank's slice is validated against that rank's spec
  const json& par = f.object(m, "parallel", "parallel");
  info.tp_world_size = int(f.integer(par, "parallel.tp_world_size", "tp_world_size", 1, 1 << 16));
  info.tp_rank = int(f.integer(par, "parallel.tp_rank", "tp_rank", 0, info.tp_world_size - 1));
  info.weights_spec = s;
  if (info.tp_world_size > 1) {
    info.tp_build_id = f.string(par, "parallel.build_id", "build_id");
    if (info.tp_build_id.empty()) f.fail("parallel.build_id", "is empty");
    try {
      info.weights_spec = rank_spec(s, info.tp_world_size, info.tp_rank);
    } catch (const Error& e) {
      f.fail("parallel.tp_world_size", std::string("does not split the architecture: ") + e.what());
    }
  }
  const ModelSpec& ws = info.weights_spec;
  // runtime bounds, and the cache description they imply
  const json& rt = f.object(m, "runtime", "runtime");
  info.bounds.max_batch = int(f.integer(rt, "runtime.max_batch", "max_batch", 1, kMaxBatch));
  info.bounds.capacity = f.integer(rt, "runtime.capacity", "capacity", 1, kMaxCapacity);
  const std::string lay = f.string(rt, "runtime.layout", "layout");
  if (lay != "heads_first" && lay != "flattened") f.fail("runtime.layout", "'" + lay + "' is not heads_first or flattened");
  info.bounds.layout = parse_layout(lay);
  const json implied = kv_cache_json(ws, info.bounds);
  if (f.field(rt, "runtime.kv_cache", "kv_cache") != implied)
    f.fail("runtime.kv_cache", "disagrees with what the architecture and bounds imply (" + implied.dump() + ")");
  // requirements
  const json& req = f.object(m, "requirements", "requirements");
  const json& cc = f.array(req, "requirements.cuda_min_capability", "cuda_min_capability");
  if (cc.size() != 2) f.fail("requirements.cuda_min_capability", "must be [major, minor]");
  info.min_cuda_major = int(f.integer(cc[0], "requirements.cuda_min_capability[0]", 0, 99));
  info.min_cuda_minor = int(f.integer(cc[1], "requirements.cuda_min_capability[1]", 0, 99));
  const auto [need_major, need_minor] = min_cuda_capability(info.weight_dtype);
  if (std::pair{info.min_cuda_major, info.min_cuda_minor} < std::pair{need_major, need_minor})
    f.fail("requirements.cuda_min_capability", "is below the " + std::to_string(need_major) + "." +
                                                   std::to_string(need_minor) + " that " +
                                                   cuda_requirement_reason(info.weight_dtype) + " need");
  // text
  const json& tok = f.object(m, "tokenizer", "tokenizer");
  info.tokenizer_json = f.optional_string(tok, "tokenizer.tokenizer.json", "tokenizer.json");
  info.tokenizer_config_json = f.optional_string(tok, "tokenizer.tokenizer_config.json", "tokenizer_config.json");
  info.special_tokens_map_json = f.optional_string(tok, "tokenizer.special_tokens_map.json", "special_tokens_map.json");
  info.chat_template = f.optional_string(tok, "tokenizer.chat_template", "chat_template");
  info.generation_defaults = f.object(m, "generation_defaults", "generation_defaults");
  // provenance
  const json& src = f.object(m, "source", "source");
  f.string(src, "source.checkpoint", "checkpoint");
  const json& files = f.array(src, "source.files", "files");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string p = "source.files[" + std::to_string(i) + "]";
    if (!files[i].is_object()) f.fail(p, "must be an object");
    f.string(files[i], p + ".name", "name");
    f.unsigned_(files[i], p + ".bytes", "bytes");
    uint64_t h;
    if (!parse_xxh64_hex(f.string(files[i], p + ".xxh64", "xxh64"), h)) f.fail(p + ".xxh64", "must be 16 lowercase hex digits");
  }
  f.object(m, "build_options", "build_options");

  // The tensor table: exactly the weights the architecture implies, in bounds, aligned, disjoint.
  const auto expect = engine_tensor_shapes(ws, info.weight_dtype, info.quant ? &*info.quant : nullptr);
  const json& table = f.array(m, "tensors", "tensors");
  if (table.size() != expect.size())
    f.fail("tensors", "lists " + std::to_string(table.size()) + " tensors, the architecture implies " +
                          std::to_string(expect.size()));
  std::set<std::string> seen;
  for (size_t i = 0; i < table.size(); ++i) {
    const std::string p = "tensors[" + std::to_string(i) + "]";
    const json& e = table[i];
    if (!e.is_object()) f.fail(p, "must be an object");
    EngineTensorRecord r;
    r.name = f.string(e, p + ".name", "name");
    const std::string tp = "tensor '" + r.name + "'";
    auto it = expect.find(r.name);
    if (it == expect.end()) f.fail(p + ".name", tp + " is not a weight of this architecture");
    if (!seen.insert(r.name).second) f.fail(p + ".name", tp + " is listed twice");
    const std::string dt = f.string(e, p + ".dtype", "dtype");
    if (!parse_tensor_dtype(dt, r.dtype) || r.dtype != it->second.second)
      f.fail(p + ".dtype", "of " + tp + " is '" + dt + "', the architecture implies " +
                               std::string(dtype_name(it->second.second)));
    const json& shape = f.array(e, p + ".shape", "shape");
    if (shape.size() > 8) f.fail(p + ".shape", "of " + tp + " has too many dimensions");
    for (size_t k = 0; k < shape.size(); ++k)
      r.shape.push_back(f.integer(shape[k], p + ".shape[" + std::to_string(k) + "]", 0, int64_t(1) << 40));
    if (r.shape != it->second.first)
      f.fail(p + ".shape", "of " + tp + " is " + shape_str(r.shape) + ", the architecture implies " +
                               shape_str(it->second.first));
    r.offset = f.unsigned_(e, p + ".offset", "offset");
    r.bytes = f.unsigned_(e, p + ".bytes", "bytes");
    const uint64_t want = uint64_t(numel(r.shape)) * dtype_size(r.dtype);
    if (r.bytes != want)
      f.fail(p + ".bytes", "of " + tp + " is " + std::to_string(r.bytes) + ", its dtype and shape give " + std::to_string(want));
    if (r.offset % kEngineAlignment != 0)
      f.fail(p + ".offset", "of " + tp + " (" + std::to_string(r.offset) + ") is not a multiple of " +
                                std::to_string(kEngineAlignment));
    if (r.offset < info.data_offset)
      f.fail(p + ".offset", "of " + tp + " (" + std::to_string(r.offset) + ") lies before the data offset " +
                                std::to_string(info.data_offset));
    if (r.offset > info.file_bytes || r.bytes > info.file_bytes - r.offset)
      f.fail(p + ".offset", "of " + tp + ": bytes " + std::to_string(r.offset) + ".." + std::to_string(r.offset + r.bytes) +
                                " lie outside the file (" + std::to_string(info.file_bytes) + " bytes)");
    if (!parse_xxh64_hex(f.string(e, p + ".xxh64", "xxh64"), r.xxh64))
      f.fail(p + ".xxh64", "of " + tp + " must be 16 lowercase hex digits");
    info.tensors.push_back(std::move(r));
  }
  std::vector<const EngineTensorRecord*> by_offset;
  for (const auto& r : info.tensors) by_offset.push_back(&r);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const EngineTensorRecord* a, const EngineTensorRecord* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes)
      throw Error(where + "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap in the file");
  return info;
}

EngineFileInfo inspect_engine(const std::string& path) {
  MappedFile map(path);
  return parse_engine_file(map.data(), map.size(), path);
}

void check_device_capability(const EngineFileInfo& info, int major, int minor) {
  if (std::pair{major, minor} < std::pair{info.min_cuda_major, info.min_cuda_minor})
    throw Error(info.path + ": the engine needs a GPU of compute capability " + std::to_string(info.min_cuda_major) +
                "." + std::to_string(info.min_cuda_minor) + " or newer (" + cuda_requirement_reason(info.weight_dtype) +
                "); this GPU has " + std::to_string(major) + "." + std::to_string(minor));
}

void check_parallel(const EngineFileInfo& info, int world_size, int rank) {
  if (info.tp_world_size != world_size || info.tp_rank != rank)
    throw Error(info.path + ": the engine was built for tensor-parallel world size " + std::to_string(info.tp_world_size) +
                ", rank " + std::to_string(info.tp_rank) + "; this process runs world size " + std::to_string(world_size) +
                ", rank " + std::to_string(rank));
}

LoadedEngine load_engine(const std::string& path, const LoadOptions& o) {
  auto map = std::make_shared<MappedFile>(path);
  LoadedEngine out;
  out.info = parse_engine_file(map->data(), map->size(), path);
  const EngineFileInfo& info = out.info;
  check_parallel(info, o.tp_world_size, o.tp_rank);

  if (o.verify) {
    // One sequential pass over the blobs; large tensors first so the threads finish together.
    // Advice values are not flags: one call each. Failure only costs speed, so it is not checked.
    ::madvise(const_cast<uint8_t*>(map->data()), map->size(), MADV_SEQUENTIAL);
    ::madvise(const_cast<uint8_t*>(map->data()), map->size(), MADV_WILLNEED);
    std::vector<size_t> order(info.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return info.tensors[a].bytes > info.tensors[b].bytes; });
    std::vector<uint64_t> got(info.tensors.size());
    uint64_t total = 0;
    for (const auto& r : info.tensors) total += r.bytes;
    std::atomic<uint64_t> done{0};
    const int64_t n = int64_t(order.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < n; ++k) {
      const EngineTensorRecord& r = info.tensors[order[size_t(k)]];
      got[order[size_t(k)]] = xxh64_of(map->data() + r.offset, r.bytes, [&](uint64_t c) {
        const uint64_t d = done.fetch_add(c) + c;
        if (o.progress) {
#pragma omp critical(ingot_engine_progress)
          o.progress(d, total);
        }
      });
    }
    for (size_t i = 0; i < info.tensors.size(); ++i) {
      const EngineTensorRecord& r = info.tensors[i];
      if (got[i] != r.xxh64)
        throw Error(path + ": tensor '" + r.name + "' is corrupt: its bytes " + std::to_string(r.offset) + ".." +
                    std::to_string(r.offset + r.bytes) + " hash to xxh64 " + xxh64_hex(got[i]) + ", the table says " +
                    xxh64_hex(r.xxh64));
    }
  }

  Engine& e = out.engine;
  e.spec = info.weights_spec;
  e.weight_dtype = info.weight_dtype;
  e.quant = info.quant;
  std::shared_ptr<const void> owner(map, map->data());
  for (const EngineTensorRecord& r : info.tensors)
    e.weights.emplace(r.name, HostTensor::borrow(r.dtype, r.shape, map->data() + r.offset, owner));
  // The readers index by the zero points and perms: check their values (small tensors) before any runs.
  if (e.quant)
    for (const std::string& n : e.quant->tensors) {
      if (!e.quant->symmetric) {
        const HostTensor& z = e.get(n + kInt4ZerosSuffix);
        check_int4_zeros(n, z.as<uint8_t>(), z.numel());
      }
      if (e.quant->act_order) {
        const HostTensor& pm = e.get(n + kInt4PermSuffix);
        check_int4_perm(n, pm.as<int32_t>(), pm.numel());
      }
    }
  e.provenance = {{"engine_file", path},
                  {"tool", info.metadata.at("tool")},
                  {"source", info.metadata.at("source")},
                  {"build_options", info.metadata.at("build_options")},
                  {"dtype", std::string(dtype_name(info.weight_dtype))}};
  return out;
}

}  // namespace ingot
