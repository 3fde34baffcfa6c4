// The ONNX export's structure and its output rules, read back with the same protobuf classes: opset and IR
// per target, the contract's inputs/outputs and symbolic dims, every weight stored once as aligned external
// data equal to the engine's bytes, the ops each target may use; and that refusals and failures leave no
// export and no temporary folder behind. The numbers are proven by onnx_export_parity (tests/onnx).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include "core/error.h"
#include "export/onnx/onnx_export.h"
#include "io/engine.h"
#include "test_helpers.h"

namespace fs = std::filesystem;
using namespace ingot;
using namespace ingot::onnx_export;

namespace {

onnx::ModelProto read_model(const std::string& path) {
  onnx::ModelProto m;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in)) << path;
  return m;
}

std::string dims(const onnx::ValueInfoProto& v) {
  std::string s;
  for (const auto& d : v.type().tensor_type().shape().dim())
    s += (s.empty() ? "" : ",") + (d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
  return s;
}

std::set<std::string> op_types(const onnx::ModelProto& m) {
  std::set<std::string> s;
  for (const auto& n : m.graph().node()) s.insert(n.op_type());
  return s;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The names in `dir` (to see that no export and no ".name.tmp-*" folder appeared).
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST(OnnxExport, OnnxRuntimeGraphMatchesTheContract) {
  test::TempDir tmp;
  ExportOptions o;
  o.capacity = 32;
  o.max_batch = 4;
  const std::string out = tmp.file("q3");
  const ExportResult r = export_onnx(test::fixture("qwen3"), out, o);
  const onnx::ModelProto m = read_model(out + "/model.onnx");
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).version(), 24);
  EXPECT_EQ(m.ir_version(), 11);
  const auto& g = m.graph();
  ASSERT_EQ(g.input_size(), 2 + 2 * r.spec.layers);
  EXPECT_EQ(g.input(0).name(), "input_ids");
  EXPECT_EQ(dims(g.input(0)), "batch,sequence");
  EXPECT_EQ(g.input(1).name(), "write_indices");
  EXPECT_EQ(dims(g.input(1)), "batch");
  EXPECT_EQ(g.input(2).name(), "past_key_values.0.key");
  EXPECT_EQ(dims(g.input(2)), "batch," + std::to_string(r.spec.kv_heads) + ",32," + std::to_string(r.spec.head_dim));
  EXPECT_EQ(g.output(0).name(), "logits");
  EXPECT_EQ(g.output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(dims(g.output(0)), "batch,sequence," + std::to_string(r.spec.vocab));
  EXPECT_EQ(g.output(2 * r.spec.layers).name(), "present." + std::to_string(r.spec.layers - 1) + ".value");
  const auto ops = op_types(m);
  EXPECT_TRUE(ops.count("TensorScatter") && ops.count("Attention"));
  EXPECT_FALSE(ops.count("ScatterElements") || ops.count("Softmax"));
  for (const auto& n : g.node())
    for (const auto& a : n.attribute()) EXPECT_NE(a.name(), "is_causal") << "the mask is explicit, never a flag";

  const auto contract = nlohmann::json::parse(std::ifstream(out + "/ingot_export.json"));
  EXPECT_EQ(contract["cache"]["capacity"], 32);
  EXPECT_EQ(contract["cache"]["max_batch"], 4);
  EXPECT_EQ(contract["cache"]["layout"], "heads_first");
  EXPECT_EQ(contract["eos_token_ids"], nlohmann::json(r.spec.eos_ids));
  EXPECT_EQ(contract["inputs"].size(), size_t(g.input_size()));
  EXPECT_EQ(contract["outputs"].size(), size_t(g.output_size()));
  EXPECT_TRUE(fs::is_regular_file(out + "/config.json"));
}

TEST(OnnxExport, WeightsAreAlignedExternalDataEqualToTheEngine) {
  test::TempDir tmp;
  ExportOptions o;
  o.capacity = 16;
  o.dtype = DType::F16;
  o.layout = CacheLayout::Flattened;
  const std::string out = tmp.file("e");
  export_onnx(test::fixture("qwen2"), out, o);
  BuildOptions bo;
  bo.dtype = DType::F16;
  const Engine e = build_engine(test::fixture("qwen2"), bo);
  const onnx::ModelProto m = read_model(out + "/model.onnx");
  std::ifstream data(out + "/model.onnx.data", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(data)), {});
  std::set<std::string> seen;
  for (const auto& t : m.graph().initializer()) {
    if (t.data_location() != onnx::TensorProto::EXTERNAL) {
      EXPECT_LE(t.raw_data().size(), 1024u) << t.name() << ": only small constants stay inline";
      continue;
    }
    std::map<std::string, std::string> kv;
    for (const auto& x : t.external_data()) kv[x.key()] = x.value();
    EXPECT_EQ(kv["location"], "model.onnx.data");
    const uint64_t off = std::stoull(kv["offset"]), len = std::stoull(kv["length"]);
    EXPECT_EQ(off % 64, 0u) << t.name();
    ASSERT_LE(off + len, bytes.size()) << t.name();
    const HostTensor* w = e.find(t.name());
    ASSERT_NE(w, nullptr) << t.name() << " is not an engine weight";
    EXPECT_EQ(t.data_type(), onnx::TensorProto::FLOAT16) << t.name();
    ASSERT_EQ(len, w->nbytes()) << t.name();
    EXPECT_EQ(0, std::memcmp(bytes.data() + off, w->data(), len)) << t.name();
    seen.insert(t.name());
  }
  EXPECT_EQ(seen.size(), e.weights.size()) << "every engine weight written once";
  const auto& g = m.graph();
  EXPECT_EQ(dims(g.input(2)), "batch,16," + std::to_string(e.spec.kv_dim()));
  EXPECT_EQ(g.input(2).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
}

TEST(OnnxExport, TensorRtFormUsesOpset17Ops) {
  test::TempDir tmp;
  ExportOptions o;
  o.capacity = 32;
  o.target = Target::TensorRT;
  const std::string out = tmp.file("t");
  export_onnx(test::fixture("qwen3_swa"), out, o);
  const onnx::ModelProto m = read_model(out + "/model.onnx");
  EXPECT_EQ(m.opset_import(0).version(), 17);
  EXPECT_EQ(m.ir_version(), 8);
  const auto ops = op_types(m);
  EXPECT_TRUE(ops.count("ScatterElements") && ops.count("Softmax"));
  for (const char* newer : {"TensorScatter", "Attention", "RMSNormalization", "RotaryEmbedding"})
    EXPECT_FALSE(ops.count(newer)) << newer << " is beyond opset 17";
}

// Qwen3.5: the linear layers' f32 conv and recurrent states are graph inputs and outputs in layer order
// beside the attention layers' caches, the delta rule is a Scan whose body's ops the contract lists, and
// the attention layers carry the output gate. (Its logits: onnx_export_parity.)
TEST(OnnxExport, Qwen35StatesAreInputsAndOutputsAndTheDeltaRuleIsAScan) {
  test::TempDir tmp;
  ExportOptions o;
  o.capacity = 32;
  o.dtype = DType::F16;
  const std::string out = tmp.file("q35");
  const ExportResult r = export_onnx(test::fixture("qwen3_5_text"), out, o);
  const LinearAttnSpec& l = r.spec.linear;
  const onnx::ModelProto m = read_model(out + "/model.onnx");
  const auto& g = m.graph();
  std::vector<std::string> ins, outs;
  for (const auto& v : g.input()) ins.push_back(v.name());
  for (const auto& v : g.output()) outs.push_back(v.name());
  std::vector<std::string> want_in{"input_ids", "write_indices"}, want_out{"logits"};
  int64_t scans = 0;
  for (int64_t i = 0; i < r.spec.layers; ++i) {
    const std::string n = std::to_string(i);
    if (r.spec.kind(i) == LayerKind::Linear) {
      want_in.insert(want_in.end(), {"past_conv_state." + n, "past_recurrent_state." + n});
      want_out.insert(want_out.end(), {"present_conv_state." + n, "present_recurrent_state." + n});
      ++scans;
    } else {
      want_in.insert(want_in.end(), {"past_key_values." + n + ".key", "past_key_values." + n + ".value"});
      want_out.insert(want_out.end(), {"present." + n + ".key", "present." + n + ".value"});
    }
  }
  ASSERT_GT(scans, 0) << "the fixture has linear layers";
  ASSERT_LT(scans, r.spec.layers) << "and attention layers";
  EXPECT_EQ(ins, want_in);
  EXPECT_EQ(outs, want_out);
  for (const auto& v : g.input()) {
    if (v.name().find("_state.") == std::string::npos) continue;
    EXPECT_EQ(v.type().tensor_type().elem_type(), onnx::TensorProto::FLOAT) << v.name() << ": f32 in an fp16 export";
    const bool conv = v.name().rfind("past_conv_state.", 0) == 0;
    EXPECT_EQ(dims(v), conv ? "batch," + std::to_string(l.conv_channels()) + "," + std::to_string(l.conv_kernel - 1)
                            : "batch," + std::to_string(l.v_heads) + "," + std::to_string(l.k_dim) + "," +
                                  std::to_string(l.v_dim))
        << v.name();
  }
  int64_t found = 0;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Scan") continue;
    ++found;
    ASSERT_EQ(n.attribute_size(), 2);
    bool has_body = false;
    for (const auto& a : n.attribute()) has_body |= a.name() == "body" && a.has_g() && a.g().node_size() > 0;
    EXPECT_TRUE(has_body);
    EXPECT_EQ(n.output(0).rfind("present_recurrent_state.", 0), 0u) << "the Scan's final state is the present state";
  }
  EXPECT_EQ(found, scans);
  const auto contract = nlohmann::json::parse(std::ifstream(out + "/ingot_export.json"));
  const std::vector<std::string> listed = contract["ops"];
  for (const char* op : {"Scan", "Conv", "Softplus", "Squeeze", "MatMul", "Attention"})
    EXPECT_NE(std::find(listed.begin(), listed.end(), op), listed.end()) << op << " (Squeeze and MatMul: the body's)";
  EXPECT_EQ(contract["linear_state"]["layers"].size(), size_t(scans));
  EXPECT_EQ(contract["linear_state"]["dtype"], "float32");
  EXPECT_EQ(contract["cache"]["dtype"], "float16");
  EXPECT_EQ(contract["inputs"].size(), size_t(g.input_size()));
}

// f16 compute: every Gemm reads an f16 activation and its f16 weight initializer directly (no widening
// Cast), the residual stream is f16, the norms run in f32 between Casts, logits stay float32.
TEST(OnnxExport, Fp16ComputeKeepsMatmulsInFp16AndNormsInF32) {
  test::TempDir tmp;
  ExportOptions o;
  o.capacity = 16;
  o.dtype = DType::F16;
  o.compute = DType::F16;
  o.target = Target::TensorRT;
  const std::string out = tmp.file("c16");
  export_onnx(test::fixture("qwen3"), out, o);
  const onnx::ModelProto m = read_model(out + "/model.onnx");
  std::map<std::string, int32_t> init_type;
  for (const auto& t : m.graph().initializer()) init_type[t.name()] = t.data_type();
  std::map<std::string, const onnx::NodeProto*> producer;
  for (const auto& n : m.graph().node())
    for (const auto& y : n.output()) producer[y] = &n;
  int64_t gemms = 0, reduce_f32 = 0;
  for (const auto& n : m.graph().node()) {
    if (n.op_type() == "Gemm") {
      ++gemms;
      ASSERT_TRUE(init_type.count(n.input(1))) << n.name() << ": weight " << n.input(1) << " is read as stored";
      EXPECT_EQ(init_type[n.input(1)], onnx::TensorProto::FLOAT16) << n.input(1);
      const auto* p = producer.count(n.input(0)) ? producer[n.input(0)] : nullptr;
      if (p && p->op_type() == "Cast") {
        for (const auto& a : p->attribute())
          if (a.name() == "to") EXPECT_EQ(a.i(), onnx::TensorProto::FLOAT16) << n.name() << "'s activation";
      }
    }
    if (n.op_type() == "ReduceMean") {  // the norms' mean of squares: its input comes from f32 values
      const auto* sq = producer.at(n.input(0));
      ASSERT_EQ(sq->op_type(), "Mul");
      const auto* x = producer.count(sq->input(0)) ? producer[sq->input(0)] : nullptr;
      if (x && x->op_type() == "Cast") ++reduce_f32;
    }
  }
  EXPECT_GT(gemms, 0);
  EXPECT_GT(reduce_f32, 0) << "the norms widen their f16 input to f32";
  EXPECT_EQ(m.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT) << "logits";
  const auto contract = nlohmann::json::parse(std::ifstream(out + "/ingot_export.json"));
  EXPECT_EQ(contract["compute_dtype"], "f16");
  EXPECT_EQ(contract["cache"]["dtype"], "float16");

  ExportOptions bad = o;
  bad.compute = DType::BF16;  // refused before anything is written
  bad.dtype = DType::BF16;
  EXPECT_THROW(export_onnx(test::fixture("qwen3"), tmp.file("b"), bad), Error);
  bad.compute = DType::F16;  // f16 compute needs f16 weights
  EXPECT_THROW(export_onnx(test::fixture("qwen3"), tmp.file("b"), bad), Error);
  EXPECT_FALSE(fs::exists(tmp.file("b")));
}

TEST(OnnxExport, RefusalsWriteNothing) {
  test::TempDir tmp;
  ExportOptions o;
  o.max_batch = 0;  // a bound out of range: refused before the temporary folder exists
  EXPECT_THROW(export_onnx(test::fixture("qwen2"), tmp.file("out"), o), Error);
  o.max_batch = 1;
  fs::create_directories(tmp.file("other"));
  std::ofstream(tmp.file("other/keep.txt")) << "keep";
  o.force = true;
  try {
    export_onnx(test::fixture("qwen2"), tmp.file("other"), o);
    ADD_FAILURE() << "a folder that is not an export was replaced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an earlier ONNX export"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_regular_file(tmp.file("other/keep.txt")));
  EXPECT_EQ(entries(tmp.str()), std::vector<std::string>{"other"});
}

TEST(OnnxExport, FailureMidwayLeavesNoPartialExportAndKeepsTheOldOne) {
  test::TempDir tmp;
  ExportOptions o;
  o.capacity = 16;
  const std::string out = tmp.file("out");
  export_onnx(test::fixture("qwen2"), out, o);
  const std::string before = file_bytes(out + "/model.onnx");
  // A checkpoint whose weights are cut short fails inside the build, after the temporary folder exists.
  fs::copy(test::fixture("qwen2"), tmp.file("m"));
  fs::resize_file(tmp.file("m/model.safetensors"), 300000);
  o.force = true;
  EXPECT_THROW(export_onnx(tmp.file("m"), out, o), Error);
  EXPECT_EQ(file_bytes(out + "/model.onnx"), before) << "the earlier export stays intact";
  auto names = entries(tmp.str());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"m", "out"})) << "no temporary folder left behind";
  // With --force and a good checkpoint the earlier export is replaced.
  export_onnx(test::fixture("qwen3"), out, o);
  EXPECT_NE(file_bytes(out + "/model.onnx"), before);
  names = entries(tmp.str());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"m", "out"}));
}
