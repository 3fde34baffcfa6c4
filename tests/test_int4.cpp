// INT4 weight-only quantization (docs/quantization.md): the packing and round-to-nearest rules, the
// build's checks, engine files that carry it and reload bitwise, and CPU parity: a model quantized at
// build runs exactly like the same model whose weights were dequantized to f32 ahead of time.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "io/engine_file.h"
#include "models/family.h"
#include "quant/int4.h"
#include "runtime/memory_plan.h"
#include "runtime/model.h"
#include "test_helpers.h"

namespace ingot {
namespace {

using nlohmann::json;

const char* const kFixtures[] = {"llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"};

RuntimeOptions bounds(int max_batch, int64_t capacity) {
  RuntimeOptions o;
  o.max_batch = max_batch;
  o.capacity = capacity;
  return o;
}

std::vector<int32_t> seq(int n, int start) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((start + 37 * i) % 500));
  return v;
}

// Logits of a two-row prefill (T > 1 products) then a one-token decode (T = 1 products), stacked.
HostTensor run(const Engine& eng) {
  auto be = make_cpu_backend();
  Model m(eng, *be, bounds(2, 32));
  HostTensor a = m.forward(Batch{{BatchRow{0, seq(9, 3), 0, {}, true}, BatchRow{1, seq(5, 11), 0, {}, true}}});
  HostTensor b = m.forward(Batch{{BatchRow{0, {17}, 9, {}, false}}});
  HostTensor out(DType::F32, {a.shape()[0] + b.shape()[0], a.shape()[1]});
  std::memcpy(out.data(), a.data(), a.nbytes());
  std::memcpy(static_cast<uint8_t*>(out.data()) + a.nbytes(), b.data(), b.nbytes());
  return out;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

Engine build(const std::string& fixture, int64_t group, std::optional<DType> dtype = std::nullopt) {
  BuildOptions bo;
  bo.dtype = dtype;
  bo.int4_group_size = group;
  return build_engine(test::fixture(fixture), bo);
}

// The same model with every weight in f32 and each INT4 weight replaced by its dequantized values.
Engine dequantized_f32(const Engine& q) {
  Engine e;
  e.spec = q.spec;
  e.weight_dtype = DType::F32;
  const WeightTable table = weight_table(q.spec);
  for (const WeightSpec& w : table.entries()) {
    HostTensor out(DType::F32, w.shape);
    const HostTensor& t = q.get(w.name);
    const bool int4 = std::find(q.quant->tensors.begin(), q.quant->tensors.end(), w.name) != q.quant->tensors.end();
    if (int4) {
      const HostTensor& sc = q.get(w.name + kInt4ScalesSuffix);
      const int64_t rows = w.shape[0], cols = w.shape[1], groups = cols / q.quant->group_size;
      for (int64_t r = 0; r < rows; ++r)
        dequantize_int4_row(t.as<uint8_t>() + r * cols / 2,
                            static_cast<const uint8_t*>(sc.data()) + size_t(r * groups) * dtype_size(sc.dtype()),
                            sc.dtype(), cols, q.quant->group_size, out.as<float>() + r * cols);
    } else {
      convert_to_f32(t.dtype(), t.data(), out.as<float>(), size_t(t.numel()));
    }
    e.weights.emplace(w.name, std::move(out));
  }
  return e;
}

// max |a - b| - (atol + rtol |b|) over all elements: <= 0 is allclose.
float allclose_excess(const HostTensor& a, const HostTensor& b, float atol, float rtol) {
  float worst = -atol;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(a.as<float>()[i] - b.as<float>()[i]) - (atol + rtol * std::fabs(b.as<float>()[i])));
  return worst;
}

using test::q;
using test::sh;

// ---------------------------------------------------------------------------------------------

TEST(Int4Pack, LowNibbleFirstWithAnOffsetOfEight) {
  // One row of one group of 32: values k * 0.5 for k = -7..7 repeated; the largest magnitude (3.5)
  // makes the scale exactly 0.5, so every value is exact.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[size_t(i)] = float(i % 15 - 7) * 0.5f;
  std::vector<uint8_t> packed(16);
  float scale = 0;
  quantize_int4(w.data(), 1, 32, 32, DType::F32, packed.data(), &scale);
  EXPECT_EQ(scale, 0.5f);
  EXPECT_EQ(packed[0], uint8_t((-7 + 8) | ((-6 + 8) << 4)));  // values 0 and 1 of the row
  std::vector<float> back(32);
  dequantize_int4_row(packed.data(), &scale, DType::F32, 32, 32, back.data());
  EXPECT_EQ(back, w);
}

TEST(Int4Pack, RoundToNearestStaysWithinHalfAStepAndZeroGroupsStayZero) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const int64_t rows = 3, cols = 128, g = 64;
  std::vector<float> w(size_t(rows * cols));
  for (float& v : w) v = normal(rng);
  for (int64_t i = 0; i < g; ++i) w[size_t(cols + i)] = 0.0f;  // row 1, group 0: all zeros
  for (DType sdt : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<uint8_t> packed(size_t(rows * cols / 2));
    std::vector<uint8_t> scales(size_t(rows * cols / g) * dtype_size(sdt));
    quantize_int4(w.data(), rows, cols, g, sdt, packed.data(), scales.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> back(static_cast<size_t>(cols));
      const uint8_t* srow = scales.data() + size_t(r * cols / g) * dtype_size(sdt);
      dequantize_int4_row(packed.data() + r * cols / 2, srow, sdt, cols, g, back.data());
      for (int64_t k = 0; k < cols / g; ++k) {
        float s;
        convert_to_f32(sdt, srow + size_t(k) * dtype_size(sdt), &s, 1);
        float amax = 0;
        for (int64_t i = 0; i < g; ++i) amax = std::max(amax, std::fabs(w[size_t(r * cols + k * g + i)]));
        if (amax == 0.0f) EXPECT_EQ(s, 0.0f);
        for (int64_t i = 0; i < g; ++i) {
          const float orig = w[size_t(r * cols + k * g + i)], got = back[size_t(k * g + i)];
          // Half a step, plus what rounding the scale to a 16-bit dtype moves the clamped end by.
          EXPECT_LE(std::fabs(got - orig), 0.5f * s + 7.0f * std::fabs(s - amax / 7.0f) + 1e-7f)
              << dtype_name(sdt) << " row " << r << " col " << k * g + i;
          EXPECT_LE(std::fabs(got), 8.0f * s);
        }
      }
    }
  }
}

TEST(Int4Plan, TheGroupSizeIsAPowerOfTwoThatDividesEveryLinearWeight) {
  const ModelSpec spec = load_model_spec(test::fixture("qwen3"));
  const WeightTable table = weight_table(spec);
  for (int64_t g : {0, 16, 48, 96, 512})
    test::expect_error([&] { plan_int4(table, g, "--group-size"); },
                       {"--group-size " + std::to_string(g), "is not a power of two in [32, 256]"});
  test::expect_error([&] { plan_int4(table, 128, "--group-size"); },
                     {"--group-size 128 does not divide the input dimension 64 of weight 'layers.0.wqkv'"});
  const QuantConfig c = plan_int4(table, 32, "--group-size");
  EXPECT_EQ(c.group_size, 32);
  // The four linear weights of each layer, nothing else (embeddings, norms and the head stay).
  EXPECT_EQ(c.tensors.size(), size_t(4 * spec.layers));
  for (const std::string& n : c.tensors) EXPECT_EQ(n.rfind("layers.", 0), 0u) << n;
}

// A published checkpoint's groups at run time: kept when the kernels take them, else the largest
// power of two in [32, 256] dividing every weight's group (a whole row: every weight's input
// dimension), else kept as published (the CPU takes them; CUDA refuses them in the loader).
TEST(Int4Plan, PublishedGroupsAreReexpressedAsPowersOfTwoTheKernelsTake) {
  EXPECT_EQ(int4_runtime_group(128, {4096, 14336}), 128);
  EXPECT_EQ(int4_runtime_group(32, {64}), 32);
  EXPECT_EQ(int4_runtime_group(-1, {4096, 14336}), 256);  // Llama-3.1-8B's rows
  EXPECT_EQ(int4_runtime_group(-1, {64, 128}), 64);       // the fixtures' rows
  EXPECT_EQ(int4_runtime_group(-1, {896, 4864}), 128);    // Qwen2.5-0.5B's rows
  EXPECT_EQ(int4_runtime_group(96, {4096, 12288}), 32);
  EXPECT_EQ(int4_runtime_group(512, {4096}), 256);
  EXPECT_EQ(int4_runtime_group(-1, {48, 64}), -1);  // no power of two from 32 divides a row of 48
  EXPECT_EQ(int4_runtime_group(40, {4000}), 40);
  EXPECT_EQ(int4_runtime_group(-1, {}), -1);
  const ModelSpec spec = load_model_spec(test::fixture("qwen3"));
  const std::vector<int64_t> cols = int4_quantizable_cols(weight_table(spec));
  EXPECT_EQ(cols.size(), size_t(4 * spec.layers));
  EXPECT_EQ(int4_runtime_group(-1, cols), 64);
}

TEST(Int4Build, QuantizedWeightsArePackedWithScalesInTheEngineDtype) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const Engine e = build("qwen3", 32, dt);
    ASSERT_TRUE(e.quant);
    EXPECT_EQ(e.quant->method, "rtn");
    EXPECT_EQ(e.quant->bits, 4);
    const Engine plain = build_engine(test::fixture("qwen3"), BuildOptions{dt, std::nullopt, {}, {}});
    EXPECT_EQ(e.weights.size(), plain.weights.size() + e.quant->tensors.size());
    for (const std::string& n : e.quant->tensors) {
      const Shape full = plain.get(n).shape();
      EXPECT_EQ(e.get(n).dtype(), DType::U8) << n;
      EXPECT_EQ(e.get(n).shape(), (Shape{full[0], full[1] / 2})) << n;
      EXPECT_EQ(e.get(n + ".scales").dtype(), dt) << n;
      EXPECT_EQ(e.get(n + ".scales").shape(), (Shape{full[0], full[1] / 32})) << n;
    }
    // What is not quantized is exactly the plain build's.
    for (auto& [n, t] : plain.weights)
      if (std::find(e.quant->tensors.begin(), e.quant->tensors.end(), n) == e.quant->tensors.end())
        EXPECT_TRUE(same_bytes(e.get(n), t)) << n;
  }
}

class Int4Parity : public ::testing::TestWithParam<const char*> {};

// The arithmetic is exact (each weight value is (nibble - 8) * scale in f32 on both sides), so the
// f32 engine's logits are identical, and a 16-bit engine's (its other weights widened) meet the fp32
// tolerances.
TEST_P(Int4Parity, ForwardEqualsTheDequantizedF32Model) {
  for (auto [dt, group] : {std::pair{DType::F32, int64_t(32)}, std::pair{DType::BF16, int64_t(64)}}) {
    const Engine qe = build(GetParam(), group, dt);
    const Engine fe = dequantized_f32(qe);
    const HostTensor a = run(qe), b = run(fe);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_LE(allclose_excess(a, b, 1e-4f, 1e-4f), 0.0f) << dtype_name(dt);
    if (dt == DType::F32) EXPECT_TRUE(same_bytes(a, b));
    // Quantization did change the model (the comparison above is not of a model with itself).
    EXPECT_FALSE(same_bytes(run(build_engine(test::fixture(GetParam()), BuildOptions{dt, std::nullopt, {}, {}})), a));
  }
}
INSTANTIATE_TEST_SUITE_P(Fixtures, Int4Parity, ::testing::ValuesIn(kFixtures));

TEST(Int4EngineFile, ReloadsBitwiseWithItsQuantizationRecorded) {
  for (DType dt : {DType::F32, DType::BF16}) {
    test::TempDir dir;
    const Engine e = build("qwen3", 64, dt);
    EngineBuildInfo info;
    info.bounds.max_batch = 2;
    info.bounds.capacity = 32;
    info.source = describe_checkpoint(test::fixture("qwen3"));
    const std::string path = dir.file("q.ingot");
    save_engine(e, info, path);
    LoadedEngine le = load_engine(path);
    ASSERT_TRUE(le.engine.quant);
    EXPECT_EQ(le.engine.quant->group_size, 64);
    EXPECT_EQ(le.engine.quant->tensors, e.quant->tensors);
    ASSERT_EQ(le.engine.weights.size(), e.weights.size());
    for (auto& [n, t] : e.weights) {
      const HostTensor* r = le.engine.find(n);
      ASSERT_NE(r, nullptr) << n;
      EXPECT_TRUE(same_bytes(*r, t)) << n;
    }
    const json& mq = le.info.metadata["weights"]["quantization"];
    EXPECT_EQ(mq["method"], "rtn");
    EXPECT_EQ(mq["bits"], 4);
    EXPECT_EQ(mq["group_size"], 64);
    EXPECT_EQ(mq["scale_dtype"], std::string(dtype_name(dt)));
    EXPECT_EQ(mq["tensors"].size(), e.quant->tensors.size());
    EXPECT_TRUE(same_bytes(run(le.engine), run(e)));
  }
}

// --quantize-lm-head: the untied head (llama3 fixture) is INT4 too, the forward equals the dequantized
// f32 model, and an engine file keeps it; a tied head (qwen3) is refused, the embedding staying 16-bit.
TEST(Int4LmHead, AnUntiedHeadIsQuantizedAndATiedOneIsRefused) {
  BuildOptions bo;
  bo.dtype = DType::F32;
  bo.int4_group_size = 32;
  bo.quantize_lm_head = true;
  const Engine qe = build_engine(test::fixture("llama3"), bo);
  ASSERT_TRUE(qe.quant);
  EXPECT_NE(std::find(qe.quant->tensors.begin(), qe.quant->tensors.end(), "lm_head"), qe.quant->tensors.end());
  EXPECT_EQ(qe.get("lm_head").dtype(), DType::U8);
  EXPECT_NE(qe.get("tok_embeddings").dtype(), DType::U8);
  const HostTensor a = run(qe);
  EXPECT_TRUE(same_bytes(a, run(dequantized_f32(qe))));
  EXPECT_FALSE(same_bytes(a, run(build("llama3", 32, DType::F32))));  // the head's quantization changed the logits

  test::TempDir dir;
  EngineBuildInfo info;
  info.bounds.max_batch = 2;
  info.bounds.capacity = 32;
  info.source = describe_checkpoint(test::fixture("llama3"));
  save_engine(qe, info, dir.file("h.ingot"));
  LoadedEngine le = load_engine(dir.file("h.ingot"));
  EXPECT_EQ(le.engine.quant->tensors, qe.quant->tensors);
  EXPECT_TRUE(same_bytes(run(le.engine), a));

  bo.int4_group_size = 32;
  try {
    build_engine(test::fixture("qwen3"), bo);
    FAIL() << "a tied head was quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--quantize-lm-head: the model ties its LM head to the embedding"), std::string::npos)
        << e.what();
  }
}

TEST(Int4EngineFile, ATableThatDisagreesWithTheQuantizationIsRefused) {
  test::TempDir dir;
  EngineBuildInfo info;
  info.source = describe_checkpoint(test::fixture("qwen2"));
  // An engine whose quantization lists a weight it stores unpacked cannot be saved.
  Engine bad = build("qwen2", 32);
  bad.quant->tensors.push_back("tok_embeddings");
  test::expect_error([&] { save_engine(bad, info, dir.file("bad.ingot")); },
                     {"INT4 weight 'tok_embeddings' is not a linear weight"});
  Engine missing = build("qwen2", 32);
  missing.weights.erase("layers.0.wo.scales");
  test::expect_error([&] { save_engine(missing, info, dir.file("bad2.ingot")); }, {"layers.0.wo.scales"});
}

// The CPU backend behind a wrapper that counts allocations and answers for INT4 as another backend
// would: int4_weights() false (a backend without INT4 kernels, as a Model sees it), or true with a
// CUDA-like dequantization scratch (the weight in f32 beyond 16 tokens) whose reservation it records.
class WrappedCpu final : public ForwardingBackend {
 public:
  explicit WrappedCpu(bool int4) : ForwardingBackend(make_cpu_backend(1)), int4_(int4) {}
  std::string name() const override { return int4_ ? "wrapped-cpu" : "no-int4"; }
  bool int4_weights() const override { return int4_; }
  size_t linear_scratch_bytes(DType wdt, int64_t rows, int64_t cols, int64_t tokens, bool perm) const override {
    return int4_ && wdt == DType::U8 && (perm || tokens > 16) ? size_t(rows * cols) * 4 : 0;
  }
  void reserve_linear_scratch(size_t bytes) override { reserved = std::max(reserved, bytes); }
  void* alloc(size_t bytes) override { return ++allocs, in_->alloc(bytes); }
  int allocs = 0;
  size_t reserved = 0;

 private:
  bool int4_;
};

TEST(Int4Backend, ABackendWithoutInt4IsRefusedBeforeAnythingIsAllocated) {
  WrappedCpu be(false);
  const Engine e = build("qwen3", 32);
  test::expect_error([&] { Model m(e, be, bounds(1, 16)); },
                     {"no-int4 backend: int4 weights are not supported", "8 INT4 linear weights", "--device cpu or cuda"});
  EXPECT_EQ(be.allocs, 0);
  // The same backend runs the unquantized model (the refusal is about INT4, not the backend).
  const Engine plain = build_engine(test::fixture("qwen3"));
  Model m(plain, be, bounds(1, 16));
  EXPECT_GT(be.allocs, 0);
}

// As the CUDA backend of f32 activations answers: its INT4 kernels take scales (and x) of one dtype, so
// a 16-bit INT4 engine is refused, by name, before anything is allocated; an f32 one runs.
class F32ScalesOnly final : public ForwardingBackend {
 public:
  F32ScalesOnly() : ForwardingBackend(make_cpu_backend(1)) {}
  std::string name() const override { return "f32-scales"; }
  bool int4_scales(DType scale_dtype) const override { return scale_dtype == DType::F32; }
  void* alloc(size_t bytes) override { return ++allocs, in_->alloc(bytes); }
  int allocs = 0;
};

TEST(Int4Backend, SixteenBitScalesOnF32ActivationsAreRefusedBeforeAnythingIsAllocated) {
  F32ScalesOnly be;
  const Engine e = build("qwen3", 32, DType::BF16);
  test::expect_error([&] { Model m(e, be, bounds(1, 16)); },
                     {"f32-scales backend: INT4 weights need activations in their scales' dtype",
                      "8 INT4 linear weights have bf16 scales", "computes in f32",
                      "INT4 weights need 16-bit activations, drop --activations f32"});
  EXPECT_EQ(be.allocs, 0);
  const Engine f32 = build("qwen3", 32, DType::F32);
  Model m(f32, be, bounds(1, 16));
  EXPECT_GT(be.allocs, 0);
}

// A backend whose memory is its own (as CUDA's: the Model uploads copies) is handed each INT4 weight
// once, after its upload and with its scales attached, to re-lay it for its kernels
// (Backend::relayout_int4); a host-memory backend never is (its weights are the engine's own bytes).
// The CPU backend reads the row layout only and refuses a weight in another, by name.
class OwnMemoryCpu final : public ForwardingBackend {
 public:
  explicit OwnMemoryCpu(bool host) : ForwardingBackend(make_cpu_backend(1)), host_(host) {}
  bool host_memory() const override { return host_; }
  void relayout_int4(Mat& w) override {
    EXPECT_TRUE(w.is_int4() && w.int4.data && w.int4.group_size > 0);
    seen.push_back(w.data);
  }
  std::vector<const void*> seen;

 private:
  bool host_;
};

TEST(Int4Backend, EachInt4WeightIsOfferedForRelayoutOnceWhereTheBackendOwnsItsMemory) {
  const Engine e = build("qwen3", 32);
  const HostTensor want = run(e);
  for (bool host : {false, true}) {
    OwnMemoryCpu be(host);
    Model m(e, be, bounds(2, 32));
    std::set<const void*> distinct(be.seen.begin(), be.seen.end());
    EXPECT_EQ(be.seen.size(), host ? 0u : e.quant->tensors.size());
    EXPECT_EQ(distinct.size(), be.seen.size());
    HostTensor a = m.forward(Batch{{BatchRow{0, seq(9, 3), 0, {}, true}, BatchRow{1, seq(5, 11), 0, {}, true}}});
    EXPECT_EQ(std::memcmp(a.data(), want.data(), a.nbytes()), 0) << "the copies run as the engine's bytes";
  }
  auto cpu = make_cpu_backend(1);
  std::vector<uint8_t> packed(8 * 64);
  std::vector<float> scales(8 * 2, 1.f), x(128, 1.f), y(8);
  Mat w{packed.data(), DType::U8, 8, 128, 64};
  w.int4 = Int4Scales{scales.data(), DType::F32, 64};
  w.int4.layout = Int4Layout::Blocks8;
  test::expect_error([&] { cpu->linear(mat(x.data(), DType::F32, 1, 128), w, nullptr, mat(y.data(), DType::F32, 1, 8)); },
                     {"cpu backend: linear: INT4 weights are read in the row layout"});
  // Rows, but with the CUDA backend's nibble order (Int4Scales::paired).
  w.int4.layout = Int4Layout::Rows;
  w.int4.paired = true;
  test::expect_error([&] { cpu->linear(mat(x.data(), DType::F32, 1, 128), w, nullptr, mat(y.data(), DType::F32, 1, 8)); },
                     {"cpu backend: linear: INT4 weights are read in the row layout"});
}

// The memory plan of an INT4 engine counts its weights packed (bytes + scales, what the engine holds)
// and the dequantization scratch the backend asks for: the largest INT4 weight, reserved on the backend
// by the Model, only when a forward may carry more tokens than the backend's decode kernel takes.
TEST(Int4Backend, TheMemoryPlanCountsPackedWeightsAndTheBackendsScratch) {
  const Engine e = build("qwen3", 32);
  WrappedCpu be(true);
  size_t largest = 0;
  const WeightTable table = weight_table(e.spec);
  for (const WeightSpec& w : table.entries())
    if (int4_quantizable(w)) largest = std::max(largest, size_t(w.shape[0] * w.shape[1]) * 4);
  ASSERT_GT(largest, 0u);
  RuntimeOptions rt = bounds(2, 16);  // up to 32 tokens per forward
  const MemoryPlan p = plan_memory(e.spec, e.weight_dtype, be.activation_dtype(), rt, be.host_memory(), &*e.quant, &be);
  EXPECT_EQ(p.weights, e.weight_bytes());
  EXPECT_EQ(p.weights, engine_weight_bytes(e.spec, e.weight_dtype, 32));
  EXPECT_LT(p.weights, engine_weight_bytes(e.spec, e.weight_dtype));
  EXPECT_EQ(p.ws.linear_scratch, largest);
  EXPECT_EQ(p.workspace, p.ws.total());
  {
    Model m(e, be, rt);
    EXPECT_EQ(be.reserved, largest);
    EXPECT_EQ(m.weight_bytes(), p.weights);
    EXPECT_EQ(m.workspace_bytes(), p.workspace);
  }
  rt.max_tokens = 16;
  EXPECT_EQ(plan_memory(e.spec, e.weight_dtype, be.activation_dtype(), rt, be.host_memory(), &*e.quant, &be).ws.linear_scratch, 0u);
  // The CPU backend reads the packed rows directly.
  auto cpu = make_cpu_backend(1);
  rt.max_tokens = 0;
  EXPECT_EQ(plan_memory(e.spec, e.weight_dtype, cpu->activation_dtype(), rt, true, &*e.quant, cpu.get()).ws.linear_scratch, 0u);
}

// The plan follows the engine's own list of INT4 weights: an LM head quantized with
// --quantize-lm-head asks for its scratch too (the largest weight there: vocabulary x hidden), at the
// logits rows of one pass, and act-order weights (a permutation the decode kernel does not take) ask
// for theirs at any token count. Planned from the group size alone, the head was counted as 16-bit and
// an INT4 head over more rows than the decode kernel takes was refused at its first such forward.
TEST(Int4Backend, TheMemoryPlanFollowsTheEnginesInt4WeightsIncludingTheHeadAndActOrder) {
  BuildOptions bo;
  bo.int4_group_size = 32;
  bo.quantize_lm_head = true;
  const Engine e = build_engine(test::fixture("llama3"), bo);
  ASSERT_TRUE(e.quant.has_value());
  ASSERT_NE(std::find(e.quant->tensors.begin(), e.quant->tensors.end(), "lm_head"), e.quant->tensors.end());
  size_t head = 0, layers = 0;
  const WeightTable table = weight_table(e.spec);  // entries() refers into it
  for (const WeightSpec& w : table.entries()) {
    if (w.shape.size() != 2) continue;
    const size_t bytes = size_t(w.shape[0] * w.shape[1]) * 4;
    if (w.name == "lm_head") head = bytes;
    else if (int4_quantizable(w)) layers = std::max(layers, bytes);
  }
  ASSERT_GT(head, layers);  // the head is the largest weight of this fixture
  WrappedCpu be(true);
  RuntimeOptions rt = bounds(2, 16);
  rt.max_tokens = 32;
  rt.max_logit_rows = 32;  // a pass of 32 logits rows through the INT4 head
  EXPECT_EQ(plan_memory(e.spec, e.weight_dtype, be.activation_dtype(), rt, be.host_memory(), &*e.quant, &be).ws.linear_scratch,
            head);
  rt.max_logit_rows = 16;  // the head within the decode kernel's rows: the layers' products only
  EXPECT_EQ(plan_memory(e.spec, e.weight_dtype, be.activation_dtype(), rt, be.host_memory(), &*e.quant, &be).ws.linear_scratch,
            layers);
  rt.max_tokens = 16;  // nothing past the decode kernel's rows
  EXPECT_EQ(plan_memory(e.spec, e.weight_dtype, be.activation_dtype(), rt, be.host_memory(), &*e.quant, &be).ws.linear_scratch,
            0u);
  QuantConfig act_order = *e.quant;
  act_order.act_order = true;
  EXPECT_EQ(plan_memory(e.spec, e.weight_dtype, be.activation_dtype(), rt, be.host_memory(), &act_order, &be).ws.linear_scratch,
            head);
}

TEST(Int4Cli, BuildInspectAndGenerateAgreeWithQuantizingAFolder) {
  test::TempDir dir;
  const std::string bin = q(INGOT_BINARY), fx = q(test::fixture("qwen3")), eng = q(dir.file("q.ingot"));
  auto [rc, out] = sh(bin + " build --quiet --model " + fx + " -o " + eng + " --quantize int4 --group-size 32");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("int4 (group 32)"), std::string::npos) << out;
  auto [rc2, text] = sh(bin + " inspect " + eng);
  ASSERT_EQ(rc2, 0) << text;
  EXPECT_NE(text.find("quantization int4 rtn (symmetric, group 32, f32 scales) on 8 linear weights"), std::string::npos)
      << text;
  auto [rc3, js] = sh(bin + " inspect --json " + eng);
  ASSERT_EQ(rc3, 0) << js;
  EXPECT_EQ(json::parse(js)["metadata"]["weights"]["quantization"]["group_size"], 32);
  const std::string gen = " --prompt-ids 3,40,41,7 --max-new-tokens 6 --device cpu";
  auto [rc4, from_engine] = sh(bin + " generate --engine " + eng + gen);
  auto [rc5, from_folder] = sh(bin + " generate --model " + fx + " --quantize int4 --group-size 32" + gen);
  ASSERT_EQ(rc4, 0) << from_engine;
  ASSERT_EQ(rc5, 0) << from_folder;
  // The lines of steps (timings and load notes aside) are the same tokens.
  auto steps = [](const std::string& s) {
    std::string out;
    size_t at = 0;
    while (at < s.size()) {
      const size_t end = s.find('\n', at);
      const std::string line = s.substr(at, end == std::string::npos ? std::string::npos : end - at);
      if (line.find("prefill") != std::string::npos || line.find("decode") != std::string::npos) out += line + "\n";
      at = end == std::string::npos ? s.size() : end + 1;
    }
    return out;
  };
  EXPECT_FALSE(steps(from_engine).empty()) << from_engine;
  EXPECT_EQ(steps(from_engine), steps(from_folder));
}

}  // namespace
}  // namespace ingot
