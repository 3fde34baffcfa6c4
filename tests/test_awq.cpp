// Activation-aware INT4 (runtime/awq.h): the folds keep the unquantized model's function, the build is
// deterministic, and the searched scales never lose to plain round to nearest on the calibration data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "core/files.h"
#include "runtime/awq.h"
#include "runtime/model.h"
#include "test_helpers.h"

namespace ingot {
namespace {

std::string demo() { return std::string(INGOT_SOURCE_DIR) + "/models/demo"; }
std::string demo_ids(const char* which) {
  return std::string(INGOT_SOURCE_DIR) + "/tests/data/quant/demo_" + which + ".ids";
}

// Every logit of one sequence run through the engine on the CPU: [len, vocab].
HostTensor logits(const Engine& eng, const std::vector<int32_t>& ids) {
  auto be = make_cpu_backend();
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = int64_t(ids.size());
  Model m(eng, *be, rt);
  BatchRow row;
  row.tokens = ids;
  row.all_logits = true;
  return m.forward(Batch{{row}});
}

std::vector<int32_t> first(std::vector<int32_t> v, size_t n) {
  v.resize(std::min(v.size(), n));
  return v;
}

std::vector<int32_t> pseudo_ids(int n, int64_t vocab) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((7 + 131 * i + (i * i) % 17) % vocab));
  return v;
}

float max_excess(const HostTensor& a, const HostTensor& b, float atol, float rtol) {
  float worst = -atol;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(a.as<float>()[i] - b.as<float>()[i]) - (atol + rtol * std::fabs(b.as<float>()[i])));
  return worst;
}

Engine build(const std::string& dir, std::optional<DType> dt, std::optional<int64_t> group = std::nullopt,
             std::vector<int32_t> calib = {}) {
  BuildOptions bo;
  bo.dtype = dt;
  if (calib.empty()) bo.int4_group_size = group;  // activation-aware: built unquantized, then quantized
  Engine e = build_engine(dir, bo);
  if (group && !calib.empty()) quantize_engine_awq(e, calib, *group);
  return e;
}

// The folds with the scaled weights kept unquantized (f32) reproduce the original logits, on the demo
// model (GQA 4:2, q/k norms) and on fixtures with q/k/v biases (qwen2) and without (qwen3). (The llama3
// fixture's random weights take alpha 0 everywhere, which would test nothing.)
TEST(AwqFold, ScaledAndFoldedWeightsComputeTheSameFunction) {
  struct Case {
    std::string dir;
    int64_t group;
  };
  const std::vector<int32_t> cal = read_calibration("", demo_ids("calibration"), "", 32000);
  for (const Case& c : {Case{demo(), 128}, Case{test::fixture("qwen2"), 32}, Case{test::fixture("qwen3"), 32}}) {
    SCOPED_TRACE(c.dir);
    Engine e = build(c.dir, DType::F32);
    const std::vector<int32_t> calib = c.dir == demo() ? first(cal, 2048) : pseudo_ids(300, e.spec.vocab);
    const std::vector<int32_t> probe = c.dir == demo() ? first(read_calibration("", demo_ids("heldout"), "", 32000), 96)
                                                       : pseudo_ids(40, e.spec.vocab);
    const HostTensor before = logits(e, probe);
    const std::vector<AwqChoice> ch = apply_awq_scales(e, calib, c.group);
    // Not vacuous: some weight took non-trivial scales.
    EXPECT_TRUE(std::any_of(ch.begin(), ch.end(), [](const AwqChoice& x) { return x.alpha > 0.0f; }));
    const HostTensor after = logits(e, probe);
    EXPECT_LE(max_excess(after, before, 1e-4f, 1e-4f), 0.0f);
  }
}

TEST(AwqBuild, IsDeterministicAndRecordsItsCalibration) {
  const std::vector<int32_t> cal = first(read_calibration("", demo_ids("calibration"), "", 32000), 1024);
  const Engine a = build(demo(), std::nullopt, 64, cal);
  const Engine b = build(demo(), std::nullopt, 64, cal);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (const auto& [name, t] : a.weights) {
    const HostTensor& u = b.get(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.data(), u.data(), t.nbytes()), 0) << name;
  }
  ASSERT_TRUE(a.quant);
  EXPECT_EQ(a.quant->method, "rtn");
  EXPECT_EQ(a.provenance.at("activation_aware").at("calibration_tokens"), cal.size());
  // Differs from plain RTN (the scales changed some weight).
  const Engine r = build(demo(), std::nullopt, 64);
  int differ = 0;
  for (const auto& [name, t] : a.weights) differ += std::memcmp(t.data(), r.get(name).data(), t.nbytes()) != 0;
  EXPECT_GT(differ, 0);
}

// On the calibration data: every weight's output error is at most RTN's (alpha 0 is RTN and is in the
// grid), strictly less in sum; the clip search lowers the sum further (each group's ratio is chosen
// for that group's error alone, ratio 1 being RTN, so only the sum over groups' cross terms is not
// bounded per weight), its ratios are on the grid; and the whole model's logits move less from the
// unquantized ones.
TEST(AwqBuild, CalibrationErrorIsAtMostRoundToNearest) {
  const std::vector<int32_t> cal = first(read_calibration("", demo_ids("calibration"), "", 32000), 2048);
  Engine e = build(demo(), std::nullopt);
  const std::vector<AwqChoice> ch = quantize_engine_awq(e, cal, 64);
  double rtn = 0, awq = 0, clipped = 0;
  int64_t below_one = 0;
  for (const AwqChoice& c : ch) {
    EXPECT_LE(c.err_awq, c.err_rtn) << c.name;
    rtn += c.err_rtn, awq += c.err_awq, clipped += c.err_clip;
    const HostTensor& t = e.get(c.name);  // packed [out, in/2]: the clip ratios are [out, in/64]
    ASSERT_EQ(int64_t(c.clip.size()), t.shape()[0] * (t.shape()[1] * 2 / 64)) << c.name;
    for (float r : c.clip) {
      const float step = (1.0f - r) / 0.05f;
      ASSERT_TRUE(r > 0.5f && r <= 1.0f && std::fabs(step - std::round(step)) < 1e-3f) << c.name << ": clip " << r;
      below_one += r < 1.0f;
    }
  }
  EXPECT_LT(awq, rtn);
  EXPECT_LT(clipped, awq);
  EXPECT_GT(below_one, 0);

  const std::vector<int32_t> probe = first(cal, 256);
  const HostTensor ref = logits(build(demo(), std::nullopt), probe);
  const HostTensor lr = logits(build(demo(), std::nullopt, 64), probe);
  const HostTensor la = logits(e, probe);
  double er = 0, ea = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    er += std::pow(double(lr.as<float>()[i]) - ref.as<float>()[i], 2);
    ea += std::pow(double(la.as<float>()[i]) - ref.as<float>()[i], 2);
  }
  EXPECT_LT(ea, er);
}

TEST(AwqBuild, UnsupportedFamiliesAndQuantizedEnginesAreRefused) {
  Engine e = build(test::fixture("qwen3_5_text"), DType::F32);
  try {
    apply_awq_scales(e, pseudo_ids(64, e.spec.vocab), 32);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("activation-aware quantization supports attention-only models"), std::string::npos)
        << err.what();
  }
  Engine q = build(test::fixture("qwen3"), DType::F32, 32);
  EXPECT_THROW(apply_awq_scales(q, pseudo_ids(64, q.spec.vocab), 32), Error);
}

}  // namespace
}  // namespace ingot
