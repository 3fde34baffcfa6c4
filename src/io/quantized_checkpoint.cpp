// Published INT4 checkpoints into the runtime layout. Each format is unpacked into one neutral form per
// checkpoint module (a nibble per value in input-feature order, a zero point and a scale per group, the
// group of each input feature), which is then laid out as the runtime table fuses the modules. Layouts
// (docs/quantization.md cites where each is defined):
//   GPTQ   qweight [in/8, out] i32, input i at bits 4*(i%8) of row i/8; qzeros [groups, out/8] i32,
//          output o at bits 4*(o%8) of column o/8, stored as zero-1 by "gptq" (v1), as zero by "gptq_v2";
//          scales [groups, out]; g_idx [in], the group of each input feature (act-order when not i/G).
//   AWQ    qweight [in, out/8] i32 and qzeros [groups, out/8] i32, output o at nibble kAwqNibble[o%8] of
//          column o/8 (AutoAWQ's interleave); scales [groups, out]; zeros as stored.
//   compressed-tensors pack-quantized: weight_packed [out, in/8] i32, input i at bits 4*(i%8), the
//          signed value + 8; weight_scale [out, groups]; weight_zero_point [out/8, groups] i32 packed
//          along the output rows, also + 8 (asymmetric only), or, as releases before 0.10 saved it,
//          weight_zero_point [out, groups] i8 signed (the zero nibble is the value + 8); weight_shape
//          [2] = [out, in].
// Every format computes value = (q - zero) * scale, which the runtime's (nibble - zero) * scale repeats
// exactly with nibble and zero as stored (the compressed-tensors offsets cancel).
#include "io/quantized_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ingot {

namespace {

using json = nlohmann::json;

// AutoAWQ packs the outputs 8c + [0, 2, 4, 6, 1, 3, 5, 7] into nibbles 0..7 of column c, so output 8c + k
// sits in nibble kAwqNibble[k].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Field access of quantization_config with errors that name the field and what it holds.
class QcFields {
 public:
  QcFields(std::string dir, const json& q) : where_(std::move(dir) + "/config.json: quantization_config."), q_(q) {}
  [[noreturn]] void fail(const std::string& field, const std::string& what) const { throw Error(where_ + field + " " + what); }
  bool has(const std::string& k) const { return q_.contains(k) && !q_.at(k).is_null(); }
  std::string str(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    if (!q_.at(k).is_string()) fail(k, "must be a string, not " + q_.at(k).dump());
    return q_.at(k).get<std::string>();
  }
  int64_t integer(const json& obj, const std::string& path, const std::string& k) const {
    if (!obj.contains(k) || !obj.at(k).is_number_integer()) fail(path, "must be an integer" + holds(obj, k));
    return obj.at(k).get<int64_t>();
  }
  bool boolean(const json& obj, const std::string& path, const std::string& k, bool def) const {
    if (!obj.contains(k) || obj.at(k).is_null()) return def;
    if (!obj.at(k).is_boolean()) fail(path, "must be true or false" + holds(obj, k));
    return obj.at(k).get<bool>();
  }
  const json& q() const { return q_; }

 private:
  static std::string holds(const json& obj, const std::string& k) {
    return obj.contains(k) ? ", not " + obj.at(k).dump() : " (missing)";
  }
  std::string where_;
  const json& q_;
};

void check_bits(const QcFields& f, const json& obj, const std::string& path, const std::string& key) {
  const int64_t bits = f.integer(obj, path, key);
  if (bits != 4) f.fail(path, "is " + std::to_string(bits) + "; only 4-bit weights load (3 and 8 bits are not supported)");
}

int64_t check_group(const QcFields& f, const json& obj, const std::string& path, const std::string& key) {
  const int64_t g = f.integer(obj, path, key);
  if (g != -1 && (g < 2 || g % 2 != 0)) f.fail(path, "is " + std::to_string(g) + "; it must be -1 (one group per row) or an even size >= 2");
  return g;
}

PublishedQuant read_gptq(const QcFields& f) {
  const json& q = f.q();
  PublishedQuant p;
  p.method = "gptq";
  check_bits(f, q, "bits", "bits");
  p.group_size = check_group(f, q, "group_size", "group_size");
  p.symmetric = f.boolean(q, "sym", "sym", true);
  p.act_order = f.boolean(q, "desc_act", "desc_act", false);
  if (f.boolean(q, "is_marlin_format", "is_marlin_format", false))
    f.fail("is_marlin_format", "is true: the Marlin re-layout is not a format this version reads (gptq or gptq_v2)");
  if (f.boolean(q, "static_groups", "static_groups", false))
    f.fail("static_groups", "is true: static groups are not supported");
  p.format = f.str("checkpoint_format", "gptq");
  if (p.format != "gptq" && p.format != "gptq_v2")
    f.fail("checkpoint_format", "is '" + p.format + "'; only \"gptq\" and \"gptq_v2\" load (" +
                                     "exllama, marlin, bitblas, ipex layouts are not supported)");
  return p;
}

PublishedQuant read_awq(const QcFields& f) {
  const json& q = f.q();
  PublishedQuant p;
  p.method = "awq";
  p.format = "gemm";
  const std::string bits_key = q.contains("bits") ? "bits" : "w_bit";
  check_bits(f, q, bits_key, bits_key);
  const std::string group_key = q.contains("group_size") ? "group_size" : "q_group_size";
  p.group_size = check_group(f, q, group_key, group_key);
  std::string version = f.str("version", "gemm");
  std::transform(version.begin(), version.end(), version.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (version != "gemm")
    f.fail("version", "is '" + f.str("version", "") + "'; only AutoAWQ's \"gemm\" layout loads (gemv, exllama, marlin, ipex do not)");
  if (!f.boolean(q, "zero_point", "zero_point", true))
    f.fail("zero_point", "is false: AWQ without zero points is not supported");
  p.symmetric = false;
  return p;
}

PublishedQuant read_compressed_tensors(const QcFields& f) {
  const json& q = f.q();
  PublishedQuant p;
  p.method = "compressed-tensors";
  p.format = f.str("format", "");
  if (p.format != "pack-quantized")
    f.fail("format", "is '" + p.format + "'; only \"pack-quantized\" (4-bit int weights packed in int32) loads");
  const std::string status = f.str("quantization_status", "compressed");
  if (status != "compressed") f.fail("quantization_status", "is '" + status + "'; only \"compressed\" checkpoints load");
  if (f.has("sparsity_config")) f.fail("sparsity_config", "is set: sparse checkpoints are not supported");
  if (f.has("kv_cache_scheme")) f.fail("kv_cache_scheme", "is set: a quantized KV cache is not supported");
  if (!f.has("config_groups") || !f.q().at("config_groups").is_object() || f.q().at("config_groups").empty())
    f.fail("config_groups", "must be an object with at least one group");
  std::optional<json> weights;
  for (const auto& [name, g] : q.at("config_groups").items()) {
    const std::string gp = "config_groups." + name;
    if (!g.is_object()) f.fail(gp, "must be an object");
    const std::string fmt = g.contains("format") && g.at("format").is_string() ? g.at("format").get<std::string>() : p.format;
    if (fmt != "pack-quantized") f.fail(gp + ".format", "is '" + fmt + "'; only \"pack-quantized\" loads");
    for (const char* act : {"input_activations", "output_activations"})
      if (g.contains(act) && !g.at(act).is_null())
        f.fail(gp + "." + act, "is set: only weight-only (W4A16) schemes load");
    if (!g.contains("weights") || !g.at("weights").is_object()) f.fail(gp + ".weights", "must be an object");
    const json& w = g.at("weights");
    if (weights && *weights != w)
      f.fail(gp + ".weights", "differs from another group's; mixed schemes are not supported");
    weights = w;
  }
  const std::string wp = "config_groups." + q.at("config_groups").items().begin().key() + ".weights";
  const json& w = *weights;
  check_bits(f, w, wp + ".num_bits", "num_bits");
  const std::string type = w.contains("type") && w.at("type").is_string() ? w.at("type").get<std::string>() : "";
  if (type != "int") f.fail(wp + ".type", "is '" + type + "'; only \"int\" weights load");
  if (f.boolean(w, wp + ".dynamic", "dynamic", false)) f.fail(wp + ".dynamic", "is true; only static weight scales load");
  const std::string strategy = w.contains("strategy") && w.at("strategy").is_string() ? w.at("strategy").get<std::string>() : "";
  if (strategy == "group") p.group_size = check_group(f, w, wp + ".group_size", "group_size");
  else if (strategy == "channel") p.group_size = -1;
  else f.fail(wp + ".strategy", "is '" + strategy + "'; only \"group\" and \"channel\" load");
  p.symmetric = f.boolean(w, wp + ".symmetric", "symmetric", true);
  if (w.contains("actorder") && !w.at("actorder").is_null()) {
    const json& a = w.at("actorder");
    // "weight" reorders while quantizing and stores the weight in its original order: nothing to undo.
    if (!(a.is_string() && a.get<std::string>() == "weight") && !(a.is_boolean() && !a.get<bool>()))
      f.fail(wp + ".actorder", "is " + a.dump() + "; group act-order (weight_g_idx) is not supported");
  }
  return p;
}

std::string strip_weight(const std::string& hf_name) {
  const std::string tail = ".weight";
  if (hf_name.size() > tail.size() && hf_name.compare(hf_name.size() - tail.size(), tail.size(), tail) == 0)
    return hf_name.substr(0, hf_name.size() - tail.size());
  return hf_name;
}

uint32_t u32_at(const TensorEntry& e, size_t i) {
  uint32_t v;
  std::memcpy(&v, e.data + i * 4, 4);
  return v;
}

// One checkpoint module in a neutral form: input-feature order, one byte per value.
struct Unpacked {
  int64_t rows = 0, cols = 0, groups = 0;
  std::vector<uint8_t> nib;    // [rows, cols] 0..15
  std::vector<uint8_t> zero;   // [rows, groups] the zero point (8 where the format stores none)
  std::vector<float> scale;    // [rows, groups], group k as the checkpoint numbers it (g_idx's values)
};

// The module's shapes: out, in (from the table's source), groups, and the tensor names.
struct Module {
  std::string prefix;
  int64_t out = 0, in = 0, groups = 0, group = 0;
};

Module module_of(const PublishedQuant& q, const Checkpoint& ck, const WeightSource& src) {
  Module m;
  m.prefix = strip_weight(src.hf_name);
  m.out = src.shape.at(0);
  m.in = src.shape.at(1);
  const std::string problem = int4_group_problem(q.group_size, m.in);
  if (!problem.empty())
    throw Error(ck.dir() + "/config.json: quantization_config.group_size: " + problem + " of '" + m.prefix + "' " +
                shape_str(src.shape));
  m.group = q.group_size < 0 ? m.in : q.group_size;
  m.groups = m.in / m.group;
  return m;
}

const TensorEntry& expect(const Checkpoint& ck, const std::string& name, bool floating, const Shape& shape) {
  const TensorEntry& e = ck.get(name);
  const bool ok = floating ? (e.dtype == DType::F16 || e.dtype == DType::BF16 || e.dtype == DType::F32) : e.dtype == DType::I32;
  if (!ok)
    throw Error(ck.dir() + ": tensor '" + name + "' has dtype " + std::string(dtype_name(e.dtype)) + ", expected " +
                (floating ? "a floating type (F16, BF16, F32)" : "I32 (packed 4-bit values)"));
  if (e.shape != shape)
    throw Error(ck.dir() + ": tensor '" + name + "' has shape " + shape_str(e.shape) + ", expected " + shape_str(shape));
  return e;
}

void need_multiple_of_8(const Checkpoint& ck, const Module& m, int64_t dim, const char* what) {
  if (dim % 8 != 0)
    throw Error(ck.dir() + ": '" + m.prefix + "' has " + what + " dimension " + std::to_string(dim) +
                ", which 8-per-int32 packing cannot hold (not a multiple of 8)");
}

// The tensors of a module checked for presence, dtype and shape.
void check_module(const PublishedQuant& q, const Checkpoint& ck, const Module& m) {
  const auto names = published_tensor_names(q, m.prefix);
  if (q.method == "gptq") {
    need_multiple_of_8(ck, m, m.in, "input");
    need_multiple_of_8(ck, m, m.out, "output");
    expect(ck, names[0], false, {m.in / 8, m.out});
    expect(ck, names[1], false, {m.groups, m.out / 8});
    expect(ck, names[2], true, {m.groups, m.out});
    if (q.act_order || ck.has(names[3])) expect(ck, names[3], false, {m.in});
  } else if (q.method == "awq") {
    need_multiple_of_8(ck, m, m.out, "output");
    expect(ck, names[0], false, {m.in, m.out / 8});
    expect(ck, names[1], false, {m.groups, m.out / 8});
    expect(ck, names[2], true, {m.groups, m.out});
  } else {
    need_multiple_of_8(ck, m, m.in, "input");
    expect(ck, names[0], false, {m.out, m.in / 8});
    expect(ck, names[1], true, {m.out, m.groups});
    const TensorEntry& s = ck.get(names[3]);
    if ((s.dtype != DType::I32 && s.dtype != DType::I64) || s.shape != Shape{2})
      throw Error(ck.dir() + ": tensor '" + names[3] + "' must be an I32 or I64 [2] tensor (the weight's [out, in]), not " +
                  std::string(dtype_name(s.dtype)) + " " + shape_str(s.shape));
    int64_t dims[2];
    for (int k = 0; k < 2; ++k) {
      if (s.dtype == DType::I32) {
        int32_t v;
        std::memcpy(&v, s.data + 4 * k, 4);
        dims[k] = v;
      } else {
        std::memcpy(&dims[k], s.data + 8 * k, 8);
      }
    }
    if (dims[0] != m.out || dims[1] != m.in)
      throw Error(ck.dir() + ": tensor '" + names[3] + "' says [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) +
                  "], the config implies [" + std::to_string(m.out) + ", " + std::to_string(m.in) + "]");
    if (!q.symmetric) {
      // Two forms: packed eight to an int32 along the rows (compressed-tensors 0.10 on), or one signed
      // byte per value, [out, groups] (earlier releases saved the zero-point parameter as it was).
      const TensorEntry& zp = ck.get(names[2]);
      if (zp.dtype == DType::I8) {
        if (zp.shape != Shape{m.out, m.groups})
          throw Error(ck.dir() + ": tensor '" + names[2] + "' (I8, one zero point per value) has shape " +
                      shape_str(zp.shape) + ", expected " + shape_str({m.out, m.groups}));
      } else {
        need_multiple_of_8(ck, m, m.out, "output");
        expect(ck, names[2], false, {m.out / 8, m.groups});
      }
    } else if (ck.has(names[2])) {
      throw Error(ck.dir() + ": tensor '" + names[2] + "' is present but the scheme is symmetric (no zero points)");
    }
    if (ck.has(m.prefix + ".weight_g_idx"))
      throw Error(ck.dir() + ": tensor '" + m.prefix + ".weight_g_idx' (group act-order) is not supported");
  }
}

std::vector<float> floats_of(const TensorEntry& e) {
  std::vector<float> v(size_t(numel(e.shape)));
  convert_to_f32(e.dtype, e.data, v.data(), v.size());
  return v;
}

// The module's values in the neutral form, scales transposed to [rows, groups] where needed.
Unpacked unpack(const PublishedQuant& q, const Checkpoint& ck, const Module& m) {
  const auto names = published_tensor_names(q, m.prefix);
  Unpacked u;
  u.rows = m.out;
  u.cols = m.in;
  u.groups = m.groups;
  u.nib.resize(size_t(m.out * m.in));
  u.zero.assign(size_t(m.out * m.groups), 8);
  u.scale.resize(size_t(m.out * m.groups));
  if (q.method == "gptq" || q.method == "awq") {
    const TensorEntry& qw = ck.get(names[0]);
    const TensorEntry& qz = ck.get(names[1]);
    const std::vector<float> sc = floats_of(ck.get(names[2]));  // [groups, out]
    const bool awq = q.method == "awq";
    for (int64_t i = 0; i < m.in; ++i)
      for (int64_t o = 0; o < m.out; ++o) {
        const uint32_t word = awq ? u32_at(qw, size_t(i * (m.out / 8) + o / 8)) : u32_at(qw, size_t((i / 8) * m.out + o));
        const int shift = awq ? 4 * kAwqNibble[o % 8] : 4 * int(i % 8);
        u.nib[size_t(o * m.in + i)] = uint8_t((word >> shift) & 15u);
      }
    for (int64_t g = 0; g < m.groups; ++g)
      for (int64_t o = 0; o < m.out; ++o) {
        const uint32_t word = u32_at(qz, size_t(g * (m.out / 8) + o / 8));
        int z = int((word >> (4 * (awq ? kAwqNibble[o % 8] : int(o % 8)))) & 15u);
        if (!awq && q.format == "gptq") {
          // v1 stores zero - 1; a stored 15 would be zero 16, which 4 bits cannot hold and readers
          // disagree on (the v1 overflow), so it is refused rather than guessed.
          if (z == 15)
            throw Error(ck.dir() + ": tensor '" + names[1] + "' stores 15 at [" + std::to_string(g) + ", output " +
                        std::to_string(o) + "]: checkpoint_format \"gptq\" adds one, giving zero point 16, outside 0..15");
          z += 1;
        }
        u.zero[size_t(o * m.groups + g)] = uint8_t(z);
        u.scale[size_t(o * m.groups + g)] = sc[size_t(g * m.out + o)];
      }
  } else {
    const TensorEntry& wp = ck.get(names[0]);
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t i = 0; i < m.in; ++i)
        u.nib[size_t(o * m.in + i)] = uint8_t((u32_at(wp, size_t(o * (m.in / 8) + i / 8)) >> (4 * (i % 8))) & 15u);
    u.scale = floats_of(ck.get(names[1]));  // already [out, groups]
    if (!q.symmetric) {
      const TensorEntry& zp = ck.get(names[2]);
      for (int64_t o = 0; o < m.out; ++o)
        for (int64_t g = 0; g < m.groups; ++g) {
          if (zp.dtype != DType::I8) {
            u.zero[size_t(o * m.groups + g)] = uint8_t((u32_at(zp, size_t((o / 8) * m.groups + g)) >> (4 * (o % 8))) & 15u);
            continue;
          }
          // The signed zero point; the stored nibble is the signed value + 8, so its zero is zp + 8.
          const int v = int(reinterpret_cast<const int8_t*>(zp.data)[o * m.groups + g]);
          if (v < -8 || v > 7)
            throw Error(ck.dir() + ": tensor '" + names[2] + "' holds zero point " + std::to_string(v) + " at [" +
                        std::to_string(o) + ", " + std::to_string(g) + "], outside the 4-bit range -8..7");
          u.zero[size_t(o * m.groups + g)] = uint8_t(v + 8);
        }
    }
  }
  for (size_t k = 0; k < u.scale.size(); ++k)
    if (!std::isfinite(u.scale[k]))
      throw Error(ck.dir() + ": tensor '" + names[q.method == "compressed-tensors" ? 1 : 2] + "' of '" + m.prefix +
                  "' holds a non-finite scale; the checkpoint is damaged and cannot run");
  if (q.symmetric)
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t g = 0; g < m.groups; ++g)
        if (u.zero[size_t(o * m.groups + g)] != 8)
          throw Error(ck.dir() + ": '" + m.prefix + "' has zero point " + std::to_string(u.zero[size_t(o * m.groups + g)]) +
                      " (output " + std::to_string(o) + ", group " + std::to_string(g) +
                      ") but quantization_config says symmetric (zero point 8)");
  return u;
}

// The input order of a module: input features sorted by group (stable), which must leave exactly
// `group` features in every group (the runtime's groups are runs of stored columns). Empty: identity.
std::vector<int32_t> order_of(const Checkpoint& ck, const Module& m, const std::vector<int32_t>& g_idx, const std::string& g_name) {
  std::vector<int64_t> count(size_t(m.groups), 0);
  for (int32_t g : g_idx) ++count[size_t(g)];
  for (int64_t g = 0; g < m.groups; ++g)
    if (count[size_t(g)] != m.group)
      throw Error(ck.dir() + ": tensor '" + g_name + "' puts " + std::to_string(count[size_t(g)]) + " input features in group " +
                  std::to_string(g) + "; every group must hold group_size " + std::to_string(m.group));
  std::vector<int32_t> perm(size_t(m.in));
  for (int64_t i = 0; i < m.in; ++i) perm[size_t(i)] = int32_t(i);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return g_idx[size_t(a)] < g_idx[size_t(b)]; });
  bool identity = true;
  for (int64_t i = 0; i < m.in && identity; ++i) identity = perm[size_t(i)] == i;
  return identity ? std::vector<int32_t>{} : perm;
}

// The g_idx of every source (which fused sources must share), checked; and the shared input order.
std::vector<int32_t> shared_order(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w,
                                  const std::vector<Module>& mods) {
  if (q.method != "gptq") return {};
  std::vector<int32_t> first;
  std::string first_name;
  std::vector<int32_t> perm;
  for (size_t s = 0; s < mods.size(); ++s) {
    const Module& m = mods[s];
    const std::string name = published_tensor_names(q, m.prefix)[3];
    if (!ck.has(name)) continue;  // absent (desc_act false): the trivial i / group
    const TensorEntry& gi = ck.get(name);
    std::vector<int32_t> g(size_t(m.in));
    for (int64_t i = 0; i < m.in; ++i) {
      g[size_t(i)] = int32_t(u32_at(gi, size_t(i)));
      if (g[size_t(i)] < 0 || g[size_t(i)] >= m.groups)
        throw Error(ck.dir() + ": tensor '" + name + "' holds group " + std::to_string(g[size_t(i)]) + " at index " +
                    std::to_string(i) + ", outside 0.." + std::to_string(m.groups - 1));
    }
    std::vector<int32_t> p = order_of(ck, m, g, name);
    if (!p.empty() && !q.act_order)
      throw Error(ck.dir() + ": tensor '" + name + "' reorders the input features (act-order) but quantization_config.desc_act is false");
    if (first_name.empty()) {
      first = std::move(g);
      first_name = name;
      perm = std::move(p);
    } else if (g != first) {
      throw Error(ck.dir() + ": act-order: '" + first_name + "' and '" + name + "' group the input features differently, but "
                  "ingot fuses them into one weight '" + w.name + "' that reads its input in one order; this checkpoint "
                  "cannot load");
    }
  }
  if (!first_name.empty() && mods.size() > 1)
    for (const Module& m : mods)
      if (!ck.has(published_tensor_names(q, m.prefix)[3]))
        throw Error(ck.dir() + ": '" + first_name + "' is present but '" + published_tensor_names(q, m.prefix)[3] +
                    "' is not; the modules fused into '" + w.name + "' must all carry g_idx or none");
  return perm;
}

std::vector<Module> modules_of(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w) {
  std::vector<Module> mods;
  for (const WeightSource& src : w.sources) mods.push_back(module_of(q, ck, src));
  return mods;
}

}  // namespace

std::optional<PublishedQuant> read_published_quant(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json cfg;
  try {
    cfg = json::parse(ss.str());
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  if (!cfg.is_object() || !cfg.contains("quantization_config") || cfg.at("quantization_config").is_null()) return std::nullopt;
  const json& q = cfg.at("quantization_config");
  if (!q.is_object()) throw Error(path + ": quantization_config must be an object, not " + q.dump());
  const QcFields f(dir, q);
  if (!q.contains("quant_method") || !q.at("quant_method").is_string())
    f.fail("quant_method", "must be a string (gptq, awq, compressed-tensors)");
  const std::string method = q.at("quant_method").get<std::string>();
  if (method == "gptq") return read_gptq(f);
  if (method == "awq") return read_awq(f);
  if (method == "compressed-tensors") return read_compressed_tensors(f);
  f.fail("quant_method", "is '" + method + "'; only gptq, awq and compressed-tensors (4-bit int weights) load");
}

std::vector<std::string> published_tensor_names(const PublishedQuant& q, const std::string& prefix) {
  if (q.method == "compressed-tensors")
    return {prefix + ".weight_packed", prefix + ".weight_scale", prefix + ".weight_zero_point", prefix + ".weight_shape"};
  if (q.method == "awq") return {prefix + ".qweight", prefix + ".qzeros", prefix + ".scales"};
  return {prefix + ".qweight", prefix + ".qzeros", prefix + ".scales", prefix + ".g_idx"};
}

bool published_quantized(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w) {
  size_t quantized = 0;
  for (const WeightSource& src : w.sources)
    quantized += ck.has(published_tensor_names(q, strip_weight(src.hf_name))[0]) ? 1 : 0;
  if (quantized == 0) return false;
  if (!int4_quantizable(w))
    throw Error(ck.dir() + ": tensor '" + published_tensor_names(q, strip_weight(w.sources.front().hf_name))[0] +
                "' is quantized, but ingot keeps '" + w.name + "' in 16 bits (only the decoder layers' attention and MLP "
                "projections load as INT4); this checkpoint cannot load");
  if (quantized != w.sources.size()) {
    std::string list;
    for (const WeightSource& src : w.sources) list += (list.empty() ? "" : ", ") + strip_weight(src.hf_name);
    throw Error(ck.dir() + ": the modules fused into '" + w.name + "' (" + list +
                ") are quantized only in part; they must all be quantized or none");
  }
  return true;
}

void check_published(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w) {
  const std::vector<Module> mods = modules_of(q, ck, w);
  for (const Module& m : mods) check_module(q, ck, m);
  shared_order(q, ck, w, mods);
}

Int4Parts convert_published(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w, DType sdt, int64_t group,
                            bool* rounded) {
  const std::vector<Module> mods = modules_of(q, ck, w);
  for (const Module& m : mods) check_module(q, ck, m);
  const std::vector<int32_t> perm = shared_order(q, ck, w, mods);
  const int64_t rows = w.shape.at(0), cols = w.shape.at(1);
  const int64_t published = mods.front().groups;  // groups a row in the checkpoint
  if (group < 2 || mods.front().group % group != 0)
    throw Error("weight '" + w.name + "': runtime INT4 groups of " + std::to_string(group) + " columns do not divide its " +
                "published groups of " + std::to_string(mods.front().group));
  const int64_t groups = cols / group, repeat = groups / published;  // runtime groups a row; per published one
  Int4Parts out{HostTensor(DType::U8, int4_packed_shape(w.shape)), HostTensor(sdt, {rows, groups}), std::nullopt, std::nullopt};
  if (!q.symmetric) out.zeros = HostTensor(DType::U8, {rows, groups});
  if (q.act_order) {
    out.perm = HostTensor(DType::I32, {cols});
    for (int64_t j = 0; j < cols; ++j) out.perm->as<int32_t>()[j] = perm.empty() ? int32_t(j) : perm[size_t(j)];
  }
  uint8_t* packed = out.packed.as<uint8_t>();  // [rows, cols/2]
  uint8_t* sc = static_cast<uint8_t*>(out.scales.data());  // [rows, groups]
  const size_t ses = dtype_size(sdt);
  int64_t r_out = 0;
  for (size_t s = 0; s < mods.size(); ++s) {
    const Unpacked u = unpack(q, ck, mods[s]);
    const RowPick& pick = w.sources[s].pick;
    const int64_t block = pick.block ? pick.block : u.rows, stride = pick.block ? pick.stride : u.rows;
    for (int64_t r0 = pick.block ? pick.offset : 0; r0 < u.rows; r0 += stride)
      for (int64_t r = r0; r < r0 + block; ++r, ++r_out) {
        const uint8_t* nib = u.nib.data() + r * cols;
        uint8_t* dst = packed + r_out * cols / 2;
        for (int64_t j = 0; j < cols; j += 2) {
          const int64_t a = perm.empty() ? j : perm[size_t(j)], b = perm.empty() ? j + 1 : perm[size_t(j + 1)];
          dst[j / 2] = uint8_t(nib[a] | (nib[b] << 4));
        }
        for (int64_t g = 0; g < groups; ++g) {
          const size_t src = size_t(r * published + g / repeat);
          const float v = u.scale[src];
          uint8_t* d = sc + size_t(r_out * groups + g) * ses;
          convert_from_f32(sdt, &v, d, 1);
          float back;
          convert_to_f32(sdt, d, &back, 1);
          if (!std::isfinite(back))
            throw Error(ck.dir() + ": a scale of '" + mods[s].prefix + "' (" + std::to_string(v) + ") overflows " +
                        std::string(dtype_name(sdt)) + "; build with a wider --dtype");
          if (back != v && rounded) *rounded = true;
          if (out.zeros) out.zeros->as<uint8_t>()[r_out * groups + g] = u.zero[src];
        }
      }
  }
  if (r_out != rows) throw Error("weight '" + w.name + "': the quantized sources give " + std::to_string(r_out) + " rows, not " + std::to_string(rows));
  return out;
}

}  // namespace ingot
