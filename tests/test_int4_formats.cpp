// The published INT4 formats (GPTQ v1/v2, AWQ gemm, compressed-tensors pack-quantized) loaded from
// folders this test writes itself: every linear module of a fixture gets known nibbles, zero points and
// fp16 scales, packed by the small packers below (written from each format's published description,
// docs/quantization.md, and independent of src/io/quantized_checkpoint.cpp). The loader must give
// back every value exactly: the CPU linear of each INT4 weight on the identity equals the known
// dequantized matrix bit for bit, and the model's logits equal those of an f32 folder holding the
// dequantized weights. Then the engine file round trip, and malformed configs and tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/backend.h"
#include "io/engine_file.h"
#include "io/quantized_checkpoint.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "runtime/model.h"
#include "runtime/reference_check.h"
#include "parity_helpers.h"
#include "test_helpers.h"

namespace ingot {
namespace {

using nlohmann::json;

// One format case: which writer, and its options.
struct Case {
  std::string name;
  std::string method;        // gptq, awq, compressed-tensors
  std::string format;        // gptq: "gptq" or "gptq_v2"; compressed-tensors: "group" or "channel"
  int64_t group = 32;        // -1: whole row
  bool sym = true;
  bool act_order = false;    // gptq desc_act with a scattered g_idx
  std::string fixture = "llama3";
  bool i8_zero_points = false;  // compressed-tensors: zero points one signed byte each (releases before 0.10)
};

std::ostream& operator<<(std::ostream& o, const Case& c) { return o << c.name; }

// The known contents of one module [out, in]: nibble, zero point and scale per value's group.
struct Known {
  int64_t out = 0, in = 0, group = 0, groups = 0;
  std::vector<uint8_t> nib;     // [out, in] 0..15, input-feature order
  std::vector<uint8_t> zero;    // [out, groups]
  std::vector<uint16_t> scale;  // [out, groups] fp16 bits
  std::vector<int32_t> g_idx;   // [in]
  float value(int64_t o, int64_t i) const {
    const int64_t g = g_idx[size_t(i)];
    return float(int(nib[size_t(o * in + i)]) - int(zero[size_t(o * groups + g)])) * f16_to_f32(scale[size_t(o * groups + g)]);
  }
};

// ----- packers, from the published layouts ------------------------------------------------------

// GPTQ qweight [in/8, out]: eight consecutive input rows per int32, row i at bits 4*(i%8).
HostTensor gptq_qweight(const Known& k) {
  HostTensor t(DType::I32, {k.in / 8, k.out});
  uint32_t* w = reinterpret_cast<uint32_t*>(t.data());
  for (int64_t i = 0; i < k.in; ++i)
    for (int64_t o = 0; o < k.out; ++o) w[(i / 8) * k.out + o] |= uint32_t(k.nib[size_t(o * k.in + i)]) << (4 * (i % 8));
  return t;
}
// GPTQ qzeros [groups, out/8]: eight consecutive outputs per int32; v1 stores zero - 1.
HostTensor gptq_qzeros(const Known& k, bool v1) {
  HostTensor t(DType::I32, {k.groups, k.out / 8});
  uint32_t* w = reinterpret_cast<uint32_t*>(t.data());
  for (int64_t g = 0; g < k.groups; ++g)
    for (int64_t o = 0; o < k.out; ++o) {
      const uint32_t z = uint32_t(k.zero[size_t(o * k.groups + g)]) - (v1 ? 1u : 0u);
      w[g * (k.out / 8) + o / 8] |= (z & 15u) << (4 * (o % 8));
    }
  return t;
}
// AutoAWQ's gemm packing: [rows, out/8], nibble j of column c holds output c*8 + order[j].
HostTensor awq_pack(const std::vector<uint8_t>& v /* [out, rows] */, int64_t out, int64_t rows) {
  static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  HostTensor t(DType::I32, {rows, out / 8});
  uint32_t* w = reinterpret_cast<uint32_t*>(t.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < out / 8; ++c)
      for (int j = 0; j < 8; ++j) w[r * (out / 8) + c] |= uint32_t(v[size_t((c * 8 + order[j]) * rows + r)]) << (4 * j);
  return t;
}
// Scales [groups, out] fp16 (GPTQ, AWQ) or [out, groups] (compressed-tensors).
HostTensor scales(const Known& k, bool transposed) {
  HostTensor t(DType::F16, transposed ? Shape{k.groups, k.out} : Shape{k.out, k.groups});
  uint16_t* s = reinterpret_cast<uint16_t*>(t.data());
  for (int64_t o = 0; o < k.out; ++o)
    for (int64_t g = 0; g < k.groups; ++g) s[transposed ? g * k.out + o : o * k.groups + g] = k.scale[size_t(o * k.groups + g)];
  return t;
}
// compressed-tensors pack_to_int32: signed values + 8, eight per int32 along `dim` (1: columns, 0: rows).
HostTensor ct_pack(const std::vector<int>& signed_vals, int64_t rows, int64_t cols, int dim) {
  HostTensor t(DType::I32, dim == 1 ? Shape{rows, cols / 8} : Shape{rows / 8, cols});
  uint32_t* w = reinterpret_cast<uint32_t*>(t.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t u = uint32_t(signed_vals[size_t(r * cols + c)] + 8);
      if (dim == 1) w[r * (cols / 8) + c / 8] |= u << (4 * (c % 8));
      else w[(r / 8) * cols + c] |= u << (4 * (r % 8));
    }
  return t;
}

// ----- the folders ------------------------------------------------------------------------------

bool is_linear(const std::string& n) {
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    if (n.find(std::string(".") + p + ".weight") != std::string::npos && n.rfind("model.layers.", 0) == 0) return true;
  return false;
}

json read_json(const std::string& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_json(const std::string& p, const json& j) { std::ofstream(p) << j.dump(2); }

json quant_config(const Case& c) {
  if (c.method == "gptq")
    return {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", c.group}, {"sym", c.sym}, {"desc_act", c.act_order},
            {"checkpoint_format", c.format}};
  if (c.method == "awq") return {{"quant_method", "awq"}, {"bits", 4}, {"group_size", c.group}, {"version", "gemm"}, {"zero_point", true}};
  json w = {{"num_bits", 4}, {"type", "int"}, {"symmetric", c.sym}, {"strategy", c.format}, {"dynamic", false}, {"actorder", nullptr}};
  if (c.format == "group") w["group_size"] = c.group;
  return {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}, {"quantization_status", "compressed"},
          {"ignore", {"lm_head"}},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", w}, {"input_activations", nullptr},
                                          {"output_activations", nullptr}, {"format", "pack-quantized"}}}}}};
}

// Writes the quantized folder `qdir` and the f32 folder `fdir` of the dequantized weights (the
// unquantized copy), both from the fixture's checkpoint; returns the known values by module.
std::map<std::string, Known> write_folders(const Case& c, const std::string& qdir, const std::string& fdir) {
  const std::string src = test::fixture(c.fixture);
  Checkpoint ck(src);
  std::mt19937 rng(1234);
  std::map<std::string, HostTensor> qt, ft;
  std::map<std::string, Known> known;
  std::map<int64_t, std::vector<int32_t>> g_idx_by_in;  // modules with one input share one act-order
  for (const std::string& n : ck.names()) {
    const TensorEntry& e = ck.get(n);
    HostTensor f32(DType::F32, e.shape);
    convert_to_f32(e.dtype, e.data, f32.as<float>(), size_t(f32.numel()));
    if (!is_linear(n)) {
      HostTensor copy(DType::F32, e.shape);
      std::memcpy(copy.data(), f32.data(), f32.nbytes());
      qt.emplace(n, std::move(copy));
      ft.emplace(n, std::move(f32));
      continue;
    }
    Known k;
    k.out = e.shape[0];
    k.in = e.shape[1];
    k.group = c.group < 0 ? k.in : c.group;
    k.groups = k.in / k.group;
    k.nib.resize(size_t(k.out * k.in));
    k.zero.resize(size_t(k.out * k.groups));
    k.scale.resize(size_t(k.out * k.groups));
    for (auto& v : k.nib) v = uint8_t(rng() % 16);
    for (auto& z : k.zero) z = c.sym ? 8 : uint8_t(c.format == "gptq" ? 1 + rng() % 15 : rng() % 16);  // v1 cannot store zero 0
    for (auto& s : k.scale) s = f32_to_f16((0.5f + float(rng() % 1000) / 1000.0f) * 0.01f);
    std::vector<int32_t>& gi = g_idx_by_in[k.in];
    if (gi.empty()) {
      gi.resize(size_t(k.in));
      std::vector<int32_t> order(size_t(k.in));
      for (int64_t i = 0; i < k.in; ++i) order[size_t(i)] = int32_t(i);
      if (c.act_order) std::shuffle(order.begin(), order.end(), rng);
      for (int64_t i = 0; i < k.in; ++i) gi[size_t(order[size_t(i)])] = int32_t(i / k.group);
    }
    k.g_idx = gi;
    HostTensor deq(DType::F32, e.shape);
    for (int64_t o = 0; o < k.out; ++o)
      for (int64_t i = 0; i < k.in; ++i) deq.as<float>()[o * k.in + i] = k.value(o, i);
    ft.emplace(n, std::move(deq));
    const std::string p = n.substr(0, n.size() - 7);
    if (c.method == "gptq") {
      qt.emplace(p + ".qweight", gptq_qweight(k));
      qt.emplace(p + ".qzeros", gptq_qzeros(k, c.format == "gptq"));
      qt.emplace(p + ".scales", scales(k, true));
      HostTensor g(DType::I32, {k.in});
      std::memcpy(g.data(), k.g_idx.data(), g.nbytes());
      qt.emplace(p + ".g_idx", std::move(g));
    } else if (c.method == "awq") {
      qt.emplace(p + ".qweight", awq_pack(k.nib, k.out, k.in));
      qt.emplace(p + ".qzeros", awq_pack(k.zero, k.out, k.groups));
      qt.emplace(p + ".scales", scales(k, true));
    } else {
      std::vector<int> sv(k.nib.size());
      for (size_t i = 0; i < sv.size(); ++i) sv[i] = int(k.nib[i]) - 8;
      qt.emplace(p + ".weight_packed", ct_pack(sv, k.out, k.in, 1));
      qt.emplace(p + ".weight_scale", scales(k, false));
      if (!c.sym) {
        std::vector<int> zv(k.zero.size());
        for (size_t i = 0; i < zv.size(); ++i) zv[i] = int(k.zero[i]) - 8;
        if (!c.i8_zero_points) {
          qt.emplace(p + ".weight_zero_point", ct_pack(zv, k.out, k.groups, 0));
        } else {
          HostTensor z(DType::I8, {k.out, k.groups});
          for (size_t i = 0; i < zv.size(); ++i) reinterpret_cast<int8_t*>(z.data())[i] = int8_t(zv[i]);
          qt.emplace(p + ".weight_zero_point", std::move(z));
        }
      }
      HostTensor shp(DType::I32, {2});
      shp.as<int32_t>()[0] = int32_t(k.out);
      shp.as<int32_t>()[1] = int32_t(k.in);
      qt.emplace(p + ".weight_shape", std::move(shp));
    }
    known.emplace(p, std::move(k));
  }
  for (const std::string& d : {qdir, fdir}) std::filesystem::create_directories(d);
  auto views = [](const std::map<std::string, HostTensor>& m) {
    std::map<std::string, TensorView> v;
    for (auto& [n, t] : m) v.emplace(n, t.view());
    return v;
  };
  write_safetensors(qdir + "/model.safetensors", views(qt));
  write_safetensors(fdir + "/model.safetensors", views(ft));
  json cfg = read_json(src + "/config.json");
  cfg["torch_dtype"] = "float32";
  write_json(fdir + "/config.json", cfg);
  cfg["quantization_config"] = quant_config(c);
  write_json(qdir + "/config.json", cfg);
  return known;
}

// The runtime weight of `w` the known modules give, stacked along rows as the table fuses them.
std::vector<float> expected_rows(const WeightSpec& w, const std::map<std::string, Known>& known) {
  std::vector<float> out;
  for (const WeightSource& s : w.sources) {
    const Known& k = known.at(s.hf_name.substr(0, s.hf_name.size() - 7));
    for (int64_t o = 0; o < k.out; ++o)
      for (int64_t i = 0; i < k.in; ++i) out.push_back(k.value(o, i));
  }
  return out;
}

// The CPU linear of an INT4 engine weight on the identity: y[t, n] = W[n, t], one product per output.
std::vector<float> linear_on_identity(const Engine& eng, const std::string& name, Backend& be) {
  const HostTensor& p = eng.get(name);
  const int64_t rows = p.shape()[0], cols = p.shape()[1] * 2;
  Mat w = mat(const_cast<void*>(p.data()), DType::U8, rows, cols);
  w.ld = cols / 2;
  const HostTensor& sc = eng.get(name + kInt4ScalesSuffix);
  w.int4 = Int4Scales{sc.data(), sc.dtype(), eng.quant->group(cols)};
  if (!eng.quant->symmetric) w.int4.zeros = eng.get(name + kInt4ZerosSuffix).as<uint8_t>();
  if (eng.quant->act_order) w.int4.perm = eng.get(name + kInt4PermSuffix).as<int32_t>();
  std::vector<float> x(size_t(cols * cols), 0.0f), y(size_t(cols * rows), 0.0f);
  for (int64_t t = 0; t < cols; ++t) x[size_t(t * cols + t)] = 1.0f;
  be.linear(mat(x.data(), DType::F32, cols, cols), w, nullptr, mat(y.data(), DType::F32, cols, rows));
  std::vector<float> out(size_t(rows * cols));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t t = 0; t < cols; ++t) out[size_t(n * cols + t)] = y[size_t(t * rows + n)];
  return out;
}

std::vector<int32_t> tokens(int n, int start) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((start + 37 * i) % 500));
  return v;
}

HostTensor logits(const Engine& eng) {
  auto be = make_cpu_backend();
  RuntimeOptions o;
  o.max_batch = 2;
  o.capacity = 32;
  Model m(eng, *be, o);
  return m.forward(Batch{{BatchRow{0, tokens(9, 3), 0, {}, true}, BatchRow{1, tokens(5, 11), 0, {}, true}}});
}

const Case kCases[] = {
    {"gptq_v1_sym_g32", "gptq", "gptq", 32, true, false},
    {"gptq_v1_asym_actorder_g32", "gptq", "gptq", 32, false, true},
    {"gptq_v1_asym_actorder_g32_qwen2_bias", "gptq", "gptq", 32, false, true, "qwen2"},
    {"gptq_v2_asym_row", "gptq", "gptq_v2", -1, false, false},
    {"gptq_v2_sym_actorder_g64", "gptq", "gptq_v2", 64, true, true, "qwen3"},
    {"awq_gemm_g32", "awq", "gemm", 32, false, false},
    {"awq_gemm_g64_qwen3", "awq", "gemm", 64, false, false, "qwen3"},
    {"ct_group_sym_g32", "compressed-tensors", "group", 32, true, false},
    {"ct_group_asym_g64", "compressed-tensors", "group", 64, false, false},
    {"ct_channel_sym", "compressed-tensors", "channel", -1, true, false},
    {"ct_channel_asym_qwen2", "compressed-tensors", "channel", -1, false, false, "qwen2"},
    {"ct_group_asym_g64_i8_zeros", "compressed-tensors", "group", 64, false, false, "llama3", true},
    {"ct_channel_asym_i8_zeros_qwen3", "compressed-tensors", "channel", -1, false, false, "qwen3", true},
};

class Int4Formats : public ::testing::TestWithParam<Case> {};

TEST_P(Int4Formats, EveryValueConvertsExactly) {
  const Case& c = GetParam();
  test::TempDir tmp;
  const auto known = write_folders(c, tmp.file("q"), tmp.file("f"));
  BuildOptions bo;
  bo.dtype = DType::F32;
  const Engine q = build_engine(tmp.file("q"), bo);
  ASSERT_TRUE(q.quant);
  EXPECT_EQ(q.quant->method, c.method);
  // Whole rows (of 64 and 128 columns in these models) are held as groups of 64, each row's scale and
  // zero repeated (int4_runtime_group), the published size kept beside them.
  EXPECT_EQ(q.quant->group_size, c.group < 0 ? 64 : c.group);
  EXPECT_EQ(q.quant->published_group, c.group < 0 ? -1 : 0);
  EXPECT_EQ(q.quant->symmetric, c.method == "awq" ? false : c.sym);
  EXPECT_EQ(q.quant->act_order, c.act_order);
  const WeightTable table = weight_table(q.spec);
  EXPECT_EQ(q.quant->tensors.size(), size_t(4 * q.spec.layers));
  auto be = make_cpu_backend();
  for (const WeightSpec& w : table.entries()) {
    if (!int4_quantizable(w)) continue;
    SCOPED_TRACE(w.name);
    EXPECT_EQ(q.get(w.name).dtype(), DType::U8);
    const std::vector<float> want = expected_rows(w, known);
    const std::vector<float> got = linear_on_identity(q, w.name, *be);
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(bad, 0u) << "of " << got.size() << " values differ";
  }
  // The model against the unquantized copy: identical without act-order (the same products in the same
  // order), and with act-order the same products summed in the stored column order.
  const Engine f = build_engine(tmp.file("f"), bo);
  const HostTensor a = logits(q), b = logits(f);
  ASSERT_EQ(a.shape(), b.shape());
  float worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_FALSE(std::isnan(a.as<float>()[i]));
    worst = std::max(worst, std::fabs(a.as<float>()[i] - b.as<float>()[i]) - (1e-4f + 1e-4f * std::fabs(b.as<float>()[i])));
  }
  EXPECT_LE(worst, 0.0f);
  if (!c.act_order) {
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  }
}

TEST_P(Int4Formats, EngineFileReloadsBitwiseAndInspectSaysWhatItIs) {
  const Case& c = GetParam();
  test::TempDir tmp;
  write_folders(c, tmp.file("q"), tmp.file("f"));
  for (DType dt : {DType::F32, DType::F16}) {
    BuildOptions bo;
    bo.dtype = dt;
    const Engine e = build_engine(tmp.file("q"), bo);
    EngineBuildInfo info;
    info.bounds.max_batch = 2;
    info.bounds.capacity = 32;
    info.source = describe_checkpoint(tmp.file("q"));
    const std::string path = tmp.file("q.ingot");
    save_engine(e, info, path);
    LoadedEngine le = load_engine(path);
    ASSERT_TRUE(le.engine.quant);
    EXPECT_EQ(le.engine.quant->method, c.method);
    EXPECT_EQ(le.engine.quant->symmetric, e.quant->symmetric);
    EXPECT_EQ(le.engine.quant->act_order, e.quant->act_order);
    EXPECT_EQ(le.engine.quant->group_size, c.group < 0 ? 64 : c.group);
    EXPECT_EQ(le.engine.quant->published_group, c.group < 0 ? -1 : 0);
    ASSERT_EQ(le.engine.weights.size(), e.weights.size());
    for (auto& [n, t] : e.weights) {
      const HostTensor* r = le.engine.find(n);
      ASSERT_NE(r, nullptr) << n;
      EXPECT_TRUE(r->shape() == t.shape() && r->dtype() == t.dtype() && std::memcmp(r->data(), t.data(), t.nbytes()) == 0) << n;
    }
    const json& mq = le.info.metadata["weights"]["quantization"];
    EXPECT_EQ(mq["method"], c.method);
    EXPECT_EQ(mq["act_order"], c.act_order);
    const HostTensor a = logits(le.engine), b = logits(e);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  }
  const std::string cmd = std::string(INGOT_BINARY) + " inspect " + tmp.file("q.ingot") + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  EXPECT_NE(out.find("quantization int4 " + c.method), std::string::npos) << out;
  EXPECT_NE(out.find(c.method == "awq" || !c.sym ? "zero points" : "symmetric"), std::string::npos) << out;
  if (c.act_order) {
    EXPECT_NE(out.find("act-order"), std::string::npos) << out;
  }
  if (c.group < 0) {
    EXPECT_NE(out.find("group 64 (published: one group per row)"), std::string::npos) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Int4Formats, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// fp16 scales in a bf16 engine are rounded (with a warning); in f16 and f32 engines they are exact.
TEST(Int4FormatsScales, Fp16ScalesAreExactInF16AndF32AndRoundedWithAWarningInBf16) {
  test::TempDir tmp;
  write_folders(kCases[0], tmp.file("q"), tmp.file("f"));
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    std::vector<std::string> warnings;
    BuildOptions bo;
    bo.dtype = dt;
    bo.warn = [&](const std::string& l) { warnings.push_back(l); };
    const Engine e = build_engine(tmp.file("q"), bo);
    EXPECT_EQ(e.get("layers.0.wqkv.scales").dtype(), dt);
    bool warned = false;
    for (const auto& w : warnings) warned |= w.find("were rounded") != std::string::npos;
    EXPECT_EQ(warned, dt == DType::BF16) << dtype_name(dt);
  }
}

using test::q;
using test::sh;

// The command line straight from a published folder: generate gives the tokens of the f32 folder of
// the dequantized weights (the logits are bitwise equal without act-order), bench runs, and build +
// inspect record the format.
TEST(Int4FormatsCli, GenerateBenchAndBuildStraightFromThePublishedFolder) {
  const std::string bin = INGOT_BINARY;
  for (const Case& c : {kCases[5], kCases[8], kCases[3]}) {
    SCOPED_TRACE(c.name);
    test::TempDir tmp;
    write_folders(c, tmp.file("q"), tmp.file("f"));
    const std::string gen = " --prompt-ids 5,17,42,7 --max-new-tokens 6 --ignore-eos --device cpu --dtype f32";
    auto [rq, outq] = sh(bin + " generate --model " + tmp.file("q") + gen);
    auto [rf, outf] = sh(bin + " generate --model " + tmp.file("f") + gen);
    ASSERT_EQ(rq, 0) << outq;
    ASSERT_EQ(rf, 0) << outf;
    auto steps = [](const std::string& o) {
      std::string s;
      for (size_t at = o.find("step "); at != std::string::npos; at = o.find("step ", at + 1)) s += o.substr(at, o.find('\n', at) - at) + "\n";
      return s;
    };
    EXPECT_FALSE(steps(outq).empty()) << outq;
    EXPECT_EQ(steps(outq), steps(outf));
    auto [rb, outb] = sh(bin + " bench --model " + tmp.file("q") + " --device cpu --prompt-len 4 --max-new-tokens 2");
    EXPECT_EQ(rb, 0) << outb;
    auto [re, oute] = sh(bin + " build --quiet --model " + tmp.file("q") + " -o " + tmp.file("e.ingot"));
    ASSERT_EQ(re, 0) << oute;
    EXPECT_NE(oute.find("int4 " + c.method), std::string::npos) << oute;
    auto [ri, outi] = sh(bin + " inspect --json " + tmp.file("e.ingot"));
    ASSERT_EQ(ri, 0) << outi;
    EXPECT_NE(outi.find("\"method\": \"" + c.method + "\""), std::string::npos) << outi;
    // --quantize on it is refused: it is already INT4.
    auto [rr, outr] = sh(bin + " generate --model " + tmp.file("q") + gen + " --quantize int4");
    EXPECT_EQ(rr, 1) << outr;
    EXPECT_NE(outr.find("is already quantized"), std::string::npos) << outr;
  }
}

// ----- bad input ------------------------------------------------------------------------------

// A folder of case `c`, then `edit` applied to its config.json and tensors.
using Tensors = std::map<std::string, HostTensor>;
std::string edited(const test::TempDir& tmp, const Case& c, const std::function<void(json&, Tensors&)>& edit) {
  const std::string d = tmp.file("q");
  write_folders(c, d, tmp.file("f"));
  json cfg = read_json(d + "/config.json");
  Tensors ts;
  {
    SafetensorsFile f(d + "/model.safetensors");
    for (auto& [n, e] : f.tensors()) {
      HostTensor t(e.dtype, e.shape);
      std::memcpy(t.data(), e.data, e.nbytes);
      ts.emplace(n, std::move(t));
    }
  }
  edit(cfg, ts);
  write_json(d + "/config.json", cfg);
  std::map<std::string, TensorView> v;
  for (auto& [n, t] : ts) v.emplace(n, t.view());
  write_safetensors(d + "/model.safetensors", v);
  return d;
}

void expect_build_error(const Case& c, const std::function<void(json&, Tensors&)>& edit,
                        std::initializer_list<std::string> fragments) {
  test::TempDir tmp;
  const std::string d = edited(tmp, c, edit);
  test::expect_error([&] { build_engine(d); }, fragments);
}

const Case& gptq_case() { return kCases[1]; }  // v1, asymmetric, act-order
const Case& awq_case() { return kCases[5]; }
const Case& ct_case() { return kCases[8]; }     // group, asymmetric

TEST(Int4FormatsBadConfig, FieldsOutsideWhatLoadsAreRefusedNamingTheField) {
  const std::string qc = "config.json: quantization_config.";
  auto set = [](const std::string& k, json v) { return [k, v](json& c, Tensors&) { c["quantization_config"][k] = v; }; };
  expect_build_error(gptq_case(), set("bits", 8), {qc + "bits is 8; only 4-bit weights load"});
  expect_build_error(gptq_case(), set("bits", 3), {qc + "bits is 3"});
  expect_build_error(gptq_case(), set("bits", "4"), {qc + "bits must be an integer"});
  expect_build_error(gptq_case(), set("quant_method", "bitsandbytes"), {qc + "quant_method is 'bitsandbytes'"});
  expect_build_error(gptq_case(), set("quant_method", 3), {qc + "quant_method must be a string"});
  expect_build_error(gptq_case(), set("checkpoint_format", "marlin"), {qc + "checkpoint_format is 'marlin'"});
  expect_build_error(gptq_case(), set("is_marlin_format", true), {qc + "is_marlin_format is true"});
  expect_build_error(gptq_case(), set("group_size", 0), {qc + "group_size is 0"});
  expect_build_error(gptq_case(), set("group_size", 33), {qc + "group_size is 33"});
  expect_build_error(gptq_case(), set("group_size", 256), {qc + "group_size: group size 256 does not divide the input dimension 64"});
  expect_build_error(gptq_case(), set("desc_act", "yes"), {qc + "desc_act must be true or false"});
  expect_build_error(gptq_case(), set("sym", 1), {qc + "sym must be true or false"});
  expect_build_error(awq_case(), set("version", "gemv"), {qc + "version is 'gemv'"});
  expect_build_error(awq_case(), set("version", "exllama"), {qc + "version is 'exllama'"});
  expect_build_error(awq_case(), set("zero_point", false), {qc + "zero_point is false"});
  expect_build_error(ct_case(), set("format", "int-quantized"), {qc + "format is 'int-quantized'"});
  expect_build_error(ct_case(), set("format", "marlin-24"), {qc + "format is 'marlin-24'"});
  auto wset = [](const std::string& k, json v) {
    return [k, v](json& c, Tensors&) { c["quantization_config"]["config_groups"]["group_0"]["weights"][k] = v; };
  };
  const std::string wp = qc + "config_groups.group_0.weights.";
  expect_build_error(ct_case(), wset("num_bits", 8), {wp + "num_bits is 8"});
  expect_build_error(ct_case(), wset("type", "float"), {wp + "type is 'float'"});
  expect_build_error(ct_case(), wset("strategy", "tensor"), {wp + "strategy is 'tensor'"});
  expect_build_error(ct_case(), wset("actorder", "group"), {wp + "actorder is \"group\""});
  expect_build_error(ct_case(), wset("dynamic", true), {wp + "dynamic is true"});
  expect_build_error(ct_case(), [](json& c, Tensors&) {
    c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  }, {qc + "config_groups.group_0.input_activations is set"});
  expect_build_error(gptq_case(), [](json& c, Tensors&) { c["quantization_config"] = "gptq"; },
                     {"quantization_config must be an object"});
}

TEST(Int4FormatsBadTensors, MalformedTensorsAreRefusedNamingTheTensor) {
  const std::string q = "model.layers.0.self_attn.q_proj", k = "model.layers.0.self_attn.k_proj";
  // Shapes and dtypes.
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.at(q + ".qweight") = HostTensor(DType::I32, {4, 64}); },
                     {"'" + q + ".qweight' has shape [4, 64], expected [8, 64]"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.at(q + ".scales") = HostTensor(DType::I32, {2, 64}); },
                     {"'" + q + ".scales' has dtype i32, expected a floating type"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.at(q + ".qzeros") = HostTensor(DType::F16, {2, 8}); },
                     {"'" + q + ".qzeros' has dtype f16, expected I32"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.erase(q + ".qzeros"); }, {q + ".qzeros"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.erase(q + ".g_idx"); }, {q + ".g_idx"});
  expect_build_error(awq_case(), [&](json&, Tensors& t) { t.at(q + ".qweight") = HostTensor(DType::I32, {8, 64}); },
                     {"'" + q + ".qweight' has shape [8, 64], expected [64, 8]"});
  expect_build_error(ct_case(), [&](json&, Tensors& t) { t.at(q + ".weight_zero_point") = HostTensor(DType::I32, {64, 1}); },
                     {"'" + q + ".weight_zero_point' has shape [64, 1], expected [8, 1]"});
  // Zero points one signed byte each (the form of compressed-tensors releases before 0.10).
  expect_build_error(ct_case(), [&](json&, Tensors& t) { t.at(q + ".weight_zero_point") = HostTensor(DType::I8, {8, 1}); },
                     {"'" + q + ".weight_zero_point' (I8, one zero point per value) has shape [8, 1], expected [64, 1]"});
  expect_build_error(ct_case(), [&](json&, Tensors& t) {
    HostTensor z(DType::I8, {64, 1});
    reinterpret_cast<int8_t*>(z.data())[5] = 9;
    t.at(q + ".weight_zero_point") = std::move(z);
  }, {"'" + q + ".weight_zero_point' holds zero point 9 at [5, 0], outside the 4-bit range -8..7"});
  expect_build_error(ct_case(), [&](json&, Tensors& t) { t.at(q + ".weight_shape").as<int32_t>()[1] = 65; },
                     {"'" + q + ".weight_shape' says [64, 65]"});
  expect_build_error(ct_case(), [&](json&, Tensors& t) { t.erase(q + ".weight_shape"); }, {q + ".weight_shape"});
  // Half-quantized fused modules, and a quantized module ingot keeps 16-bit.
  expect_build_error(gptq_case(), [&](json&, Tensors& t) {
    for (const char* s : {".qweight", ".qzeros", ".scales", ".g_idx"}) t.erase(k + s);
    t.emplace(k + ".weight", HostTensor(DType::F32, {32, 64}));
  }, {"quantized only in part"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) {
    t.emplace("lm_head.qweight", HostTensor(DType::I32, {8, 512}));
  }, {"'lm_head.qweight' is quantized, but ingot keeps 'lm_head' in 16 bits", "cannot load"});
  // Values: act-order groups that differ across fused q/k/v, g_idx out of range or uneven, v1 zero 16,
  // a symmetric config with other zero points, NaN scales.
  expect_build_error(gptq_case(), [&](json&, Tensors& t) {
    // One feature of group 0 and one of group 1 trade places: still a valid grouping, another order.
    int32_t* g = t.at(k + ".g_idx").as<int32_t>();
    const int i = int(std::find(g, g + 64, 0) - g), j = int(std::find(g, g + 64, 1) - g);
    std::swap(g[i], g[j]);
  }, {"act-order", q + ".g_idx", k + ".g_idx", "group the input features differently", "layers.0.wqkv"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.at(q + ".g_idx").as<int32_t>()[5] = 2; },
                     {"'" + q + ".g_idx' holds group 2 at index 5, outside 0..1"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) {
    int32_t* g = t.at(q + ".g_idx").as<int32_t>();
    for (int i = 0; i < 64; ++i) g[i] = i < 40 ? 0 : 1;
  }, {"'" + q + ".g_idx' puts 40 input features in group 0; every group must hold group_size 32"});
  expect_build_error(kCases[0], [&](json&, Tensors& t) {
    int32_t* g = t.at(q + ".g_idx").as<int32_t>();
    for (int i = 0; i < 64; ++i) g[i] = i % 2;
  }, {"'" + q + ".g_idx' reorders the input features (act-order) but quantization_config.desc_act is false"});
  expect_build_error(gptq_case(), [&](json&, Tensors& t) { t.at(q + ".qzeros").as<int32_t>()[0] |= 0xf; },
                     {"'" + q + ".qzeros' stores 15", "zero point 16"});
  expect_build_error(kCases[0], [&](json&, Tensors& t) { t.at(q + ".qzeros").as<int32_t>()[0] ^= 0x3; },
                     {"'" + q + "' has zero point", "says symmetric"});
  expect_build_error(kCases[7], [&](json&, Tensors& t) {
    t.at(q + ".weight_scale").as<uint16_t>()[3] = 0x7e00;  // fp16 NaN
  }, {q, "non-finite scale"});
  // A quantization_config with no quantized module at all.
  expect_build_error(gptq_case(), [&](json&, Tensors& t) {
    for (auto it = t.begin(); it != t.end();) {
      const std::string& n = it->first;
      if (n.find(".qweight") != std::string::npos || n.find(".qzeros") != std::string::npos ||
          n.find(".scales") != std::string::npos || n.find(".g_idx") != std::string::npos) {
        const std::string p = n.substr(0, n.rfind('.'));
        if (n.find(".qweight") != std::string::npos) {
          HostTensor w(DType::F32, {it->second.shape()[1], it->second.shape()[0] * 8});
          t.emplace(p + ".weight", std::move(w));
        }
        it = t.erase(it);
      } else {
        ++it;
      }
    }
  }, {"has a quantization_config (gptq) but no linear weight holds"});
}

// A layer in a GPTQ checkpoint with a q/k/v whose g_idx differ (fixed above) is refused; an AutoGPTQ
// zero bias on a model without biases is accepted, a non-zero one refused.
TEST(Int4FormatsBadTensors, ZeroBiasesOfQuantizedModulesAreAcceptedOthersRefused) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  {
    test::TempDir tmp;
    const std::string d = edited(tmp, kCases[0], [&](json&, Tensors& t) { t.emplace(q + ".bias", HostTensor(DType::F16, {64})); });
    EXPECT_NO_THROW(build_engine(d));
  }
  expect_build_error(kCases[0], [&](json&, Tensors& t) {
    HostTensor b(DType::F32, {64});
    b.as<float>()[7] = 0.5f;
    t.emplace(q + ".bias", std::move(b));
  }, {"'" + q + ".bias' is not zero"});
}

// A module the checkpoint left unquantized (plain ".weight", e.g. skipped by the quantizer) stays in
// the engine dtype with its own values, and only the quantized ones are listed as INT4.
TEST(Int4FormatsPartial, ModulesLeftUnquantizedStayPlain) {
  for (const Case& c : {kCases[1], kCases[8]}) {
    SCOPED_TRACE(c.name);
    test::TempDir tmp;
    const std::string down = "model.layers.1.mlp.down_proj";
    const std::string d = edited(tmp, c, [&](json&, Tensors& t) {
      for (auto it = t.begin(); it != t.end();) it = it->first.rfind(down + ".", 0) == 0 ? t.erase(it) : std::next(it);
      HostTensor w(DType::F32, {64, 128});
      for (int64_t i = 0; i < w.numel(); ++i) w.as<float>()[i] = float(i % 7) * 0.01f;
      t.emplace(down + ".weight", std::move(w));
    });
    BuildOptions bo;
    bo.dtype = DType::F32;
    const Engine e = build_engine(d, bo);
    ASSERT_TRUE(e.quant);
    EXPECT_EQ(e.quant->tensors.size(), size_t(4 * e.spec.layers - 1));
    EXPECT_EQ(std::count(e.quant->tensors.begin(), e.quant->tensors.end(), "layers.1.w_down"), 0);
    const HostTensor& w = e.get("layers.1.w_down");
    ASSERT_EQ(w.dtype(), DType::F32);
    ASSERT_EQ(w.shape(), (Shape{64, 128}));
    for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(w.as<float>()[i], float(i % 7) * 0.01f) << i;
    EXPECT_EQ(e.find("layers.1.w_down.scales"), nullptr);
    EXPECT_FALSE(std::isnan(logits(e).as<float>()[0]));
  }
}

// An engine file whose zero points or perm are out of range is refused on load, before any run.
TEST(Int4FormatsEngineFile, ZeroPointsAndPermsAreCheckedOnLoad) {
  test::TempDir tmp;
  write_folders(gptq_case(), tmp.file("q"), tmp.file("f"));
  BuildOptions bo;
  bo.dtype = DType::F32;
  EngineBuildInfo info;
  info.bounds.max_batch = 1;
  info.bounds.capacity = 16;
  info.source = describe_checkpoint(tmp.file("q"));
  {
    Engine e = build_engine(tmp.file("q"), bo);
    e.weights.at("layers.0.wo.zeros").as<uint8_t>()[3] = 16;
    save_engine(e, info, tmp.file("z.ingot"));
    test::expect_error([&] { load_engine(tmp.file("z.ingot")); }, {"'layers.0.wo'", "zero point 16 at index 3", "outside 0..15"});
  }
  {
    Engine e = build_engine(tmp.file("q"), bo);
    int32_t* p = e.weights.at("layers.1.w_down.perm").as<int32_t>();
    p[0] = p[1];
    save_engine(e, info, tmp.file("p.ingot"));
    test::expect_error([&] { load_engine(tmp.file("p.ingot")); }, {"'layers.1.w_down'", "perm[1]", "no permutation"});
  }
}

// ----- the committed fixtures of tools/write_quantized.py ---------------------------------------

// The fixtures tools/write_quantized.py wrote (tests/data/models/int4/manifest.json): the test list
// follows the committed manifest, so a listed fixture whose folder is missing fails rather than skips.
std::string int4_fixture_dir() { return test::fixture("int4"); }
std::vector<std::string> manifest_fixtures() {
  const std::string path = int4_fixture_dir() + "/manifest.json";
  std::vector<std::string> names;
  if (!std::filesystem::exists(path)) return names;
  const json m = read_json(path);
  for (const json& f : m.at("fixtures")) names.push_back(f.at("name").get<std::string>());
  return names;
}

// Every folder under tests/data/models/int4 is listed, and every listed one exists.
TEST(Int4FormatFixtures, TheManifestListsExactlyTheCommittedFolders) {
  const std::string dir = int4_fixture_dir();
  if (!std::filesystem::exists(dir)) {
    EXPECT_TRUE(manifest_fixtures().empty());
    return;
  }
  std::vector<std::string> folders;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory()) folders.push_back(e.path().filename().string());
  std::vector<std::string> listed = manifest_fixtures();
  std::sort(folders.begin(), folders.end());
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(folders, listed);
  EXPECT_FALSE(listed.empty()) << dir << " exists but its manifest lists no fixture";
}

class Int4FormatParity : public ::testing::TestWithParam<std::tuple<std::string, CacheLayout>> {};

// The folder straight from disk against transformers' fp32 logits on the dequantized weights: the
// arithmetic is exact, so the fp32 tolerances hold (atol 1e-4, rtol 1e-4) and greedy ids agree.
TEST_P(Int4FormatParity, MatchesTransformersOnTheDequantizedWeights) {
  const auto& [name, layout] = GetParam();
  const std::string dir = int4_fixture_dir() + "/" + name;
  Reference ref = load_reference(dir + "/reference.safetensors");
  BuildOptions bo;
  bo.dtype = DType::F32;
  Engine eng = build_engine(dir, bo);
  ASSERT_TRUE(eng.quant) << dir << " did not load as INT4";
  test::expect_reference_parity(eng, ref, layout, name, {1u, 2u});
}

INSTANTIATE_TEST_SUITE_P(Committed, Int4FormatParity,
                         ::testing::Combine(::testing::ValuesIn(manifest_fixtures()),
                                            ::testing::Values(CacheLayout::HeadsFirst, CacheLayout::Flattened)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + layout_name(std::get<1>(info.param));
                         });
// Before tools/write_quantized.py's fixtures are committed the list is empty, which is not an error.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Int4FormatParity);

}  // namespace
}  // namespace ingot
