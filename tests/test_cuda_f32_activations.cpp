// The CUDA backend of f32 activations over 16-bit weights (`--activations f32`) against the CPU
// backend, op by op. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/logprobs.h"
#include "core/dtype.h"
#include "cuda_ops_fixture.h"
#include "cuda_test_helpers.h"
#include "test_helpers.h"

#ifdef INGOT_WITH_CUDA
namespace ingot {
namespace {

using namespace test;

// The CUDA backend of f32 activations with 16-bit weights (the parameter: bf16 or f16) against the CPU
// backend, which computes exactly so: f32 activations, the weights widened in registers. Weights,
// biases, norm weights and embedding tables are rounded to the weight dtype; activations stay f32.
class CudaF32Activations : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CUDA backend's conformance tests need a GPU";
    wt_ = GetParam();
    gpu_be_ = make_cuda_backend(DType::F32);
    cpu_be_ = make_cpu_backend(2);
    gpu_ = std::make_unique<Side>(Side{*gpu_be_, DType::F32, {}});
    cpu_ = std::make_unique<Side>(Side{*cpu_be_, DType::F32, {}});
  }
  void TearDown() override {
    gpu_.reset();
    cpu_.reset();
  }
  // Normal values in f32.
  std::vector<float> rnd(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  // v rounded to the weight dtype (what a weight, or x in a multi-token product, holds).
  std::vector<float> round_w(std::vector<float> v) const {
    std::vector<uint8_t> raw(v.size() * dtype_size(wt_));
    convert_from_f32(wt_, v.data(), raw.data(), v.size());
    convert_to_f32(wt_, raw.data(), v.data(), v.size());
    return v;
  }
  // A weight dtype buffer of v on side s.
  void* put_w(Side& s, const std::vector<float>& v) { return s.put(v, wt_); }

  DType wt_ = DType::BF16;
  std::unique_ptr<Backend> gpu_be_, cpu_be_;
  std::unique_ptr<Side> gpu_, cpu_;
  std::mt19937 rng_{7};
};

// Every product the fixture's shapes need rounds at most x: one token on the GEMV (K a multiple of its
// vector) reads x as it is, so it equals the CPU on the same f32 x up to summation order, at fp32's
// tolerance; more tokens (and K the GEMV cannot take) round x to the weight dtype for cuBLASLt, so
// they equal the CPU on x rounded first, up to summation order (tensor cores: atol 1e-3 of the
// outputs' scale, rtol 1e-4).
TEST_P(CudaF32Activations, Linear) {
  struct Shape {
    int64_t N, K;
    bool bias;
  };
  const std::vector<Shape> shapes = {{37, 64, false},  {129, 1024, true}, {70, 1096, false}, {33, 2048, true},
                                     {131, 4096, false}, {65, 4104, true}, {33, 67, true}};
  size_t most = 0;
  for (int64_t T : {1, 2, 7, 64})
    for (const Shape& s : shapes) most = std::max(most, gpu_be_->linear_scratch_bytes(wt_, s.N, s.K, T, false));
  gpu_be_->reserve_linear_scratch(most);
  int gemv = 0, rounded = 0;
  for (int64_t T : {1, 2, 7, 64})
    for (const Shape& s : shapes) {
      auto x = rnd(size_t(T * s.K)), w = round_w(rnd(size_t(s.N * s.K), 0.05f)), b = round_w(rnd(size_t(s.N)));
      const bool reads_x = T == 1 && s.K % int64_t(16 / dtype_size(wt_)) == 0;
      EXPECT_EQ(gpu_be_->linear_scratch_bytes(wt_, s.N, s.K, T, false),
                reads_x ? 0u : size_t(T * s.K) * dtype_size(wt_));
      Side& g = *gpu_;
      Side& c = *cpu_;
      void *gy = g.put(std::vector<float>(size_t(T * s.N), 7.0f)), *cy = c.put(std::vector<float>(size_t(T * s.N)));
      gpu_be_->linear(g.m(g.put(x), T, s.K), mat(put_w(g, w), wt_, s.N, s.K), s.bias ? put_w(g, b) : nullptr,
                      g.m(gy, T, s.N));
      cpu_be_->linear(c.m(c.put(reads_x ? x : round_w(x)), T, s.K), mat(put_w(c, w), wt_, s.N, s.K),
                      s.bias ? put_w(c, b) : nullptr, c.m(cy, T, s.N));
      const std::vector<float> want = c.get(cy, size_t(T * s.N));
      double ss = 0;
      for (float v : want) ss += double(v) * v;
      const double scale = std::sqrt(ss / double(want.size()));
      const std::string what = std::string(dtype_name(wt_)) + " weights, f32 x: linear T=" + std::to_string(T) +
                               " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + (s.bias ? " bias" : "");
      expect_close(g.get(gy, size_t(T * s.N)), want, reads_x ? tol_for(DType::F32) : Tol{1e-3 * scale, 1e-4}, what);
      ++(reads_x ? gemv : rounded);
    }
  EXPECT_EQ(gemv, 6);
  EXPECT_EQ(rounded, 22);
}

// The multi-token product's rounded x lives in the scratch a Model reserves; without it the call is
// refused by name (never a write past a buffer).
TEST_P(CudaF32Activations, LinearRefusesAMultiTokenCallWithoutItsScratch) {
  const int64_t T = 3, N = 16, K = 64;
  Side& g = *gpu_;
  void *gx = g.put(rnd(size_t(T * K))), *gw = put_w(g, round_w(rnd(size_t(N * K)))),
       *gy = g.put(std::vector<float>(size_t(T * N)));
  test::expect_error([&] { gpu_be_->linear(g.m(gx, T, K), mat(gw, wt_, N, K), nullptr, g.m(gy, T, N)); },
                     {"3 rows of 64 f32 activations against " + std::string(dtype_name(wt_)) + " weights need " +
                          std::to_string(T * K * int64_t(dtype_size(wt_))) + " bytes",
                      "reserve_linear_scratch"});
}

// The fused gate/up + SwiGLU of one token equals linear then swiglu in f32 bit for bit on the GPU, and
// the CPU's two ops at fp32's tolerance; more tokens are declined.
TEST_P(CudaF32Activations, LinearSwigluMatchesTwoOps) {
  struct Shape {
    int64_t I, K;
  };
  for (Shape s : {Shape{96, 64}, Shape{37, 1096}, Shape{300, 2048}, Shape{77, 3072}, Shape{130, 4104}}) {
    auto x = rnd(size_t(s.K)), w = round_w(rnd(size_t(2 * s.I * s.K), 0.05f));
    Side& g = *gpu_;
    Side& c = *cpu_;
    void *gx = g.put(x), *gw = put_w(g, w);
    void *fused = g.put(std::vector<float>(size_t(s.I), 7.0f)), *gu = g.put(std::vector<float>(size_t(2 * s.I)));
    void* two = g.put(std::vector<float>(size_t(s.I)));
    ASSERT_TRUE(gpu_be_->linear_swiglu(g.m(gx, 1, s.K), mat(gw, wt_, 2 * s.I, s.K), g.m(fused, 1, s.I)));
    gpu_be_->linear(g.m(gx, 1, s.K), mat(gw, wt_, 2 * s.I, s.K), nullptr, g.m(gu, 1, 2 * s.I));
    gpu_be_->swiglu(g.m(gu, 1, 2 * s.I), g.m(two, 1, s.I));
    const std::string what = std::string(dtype_name(wt_)) + " weights, f32 x: linear_swiglu I=" +
                             std::to_string(s.I) + " K=" + std::to_string(s.K);
    const auto got = g.get(fused, size_t(s.I));
    EXPECT_EQ(got, g.get(two, size_t(s.I))) << what;
    void *cgu = c.put(std::vector<float>(size_t(2 * s.I))), *cy = c.put(std::vector<float>(size_t(s.I)));
    cpu_be_->linear(c.m(c.put(x), 1, s.K), mat(put_w(c, w), wt_, 2 * s.I, s.K), nullptr, c.m(cgu, 1, 2 * s.I));
    cpu_be_->swiglu(c.m(cgu, 1, 2 * s.I), c.m(cy, 1, s.I));
    expect_close(got, c.get(cy, size_t(s.I)), tol_for(DType::F32), what);
  }
  Side& g = *gpu_;
  void *gx = g.put(rnd(size_t(2 * 64))), *gw = put_w(g, round_w(rnd(size_t(64 * 64), 0.05f)));
  void* out = g.put(std::vector<float>(size_t(2 * 32)));
  EXPECT_FALSE(gpu_be_->linear_swiglu(g.m(gx, 2, 64), mat(gw, wt_, 64, 64), g.m(out, 2, 32)));
}

// A 16-bit table gives f32 rows, widened exactly.
TEST_P(CudaF32Activations, Embedding) {
  const int64_t V = 37, H = 67, T = 5;
  auto table = round_w(rnd(size_t(V * H)));
  std::vector<int32_t> ids = {0, 36, 5, 5, 17};
  Side& g = *gpu_;
  Side& c = *cpu_;
  void* go = g.put(std::vector<float>(size_t(T * H), 7.0f));
  void* co = c.put(std::vector<float>(size_t(T * H)));
  gpu_be_->embedding(mat(put_w(g, table), wt_, V, H), g.put_i32(ids), g.m(go, T, H));
  cpu_be_->embedding(mat(put_w(c, table), wt_, V, H), c.put_i32(ids), c.m(co, T, H));
  const auto got = g.get(go, size_t(T * H));
  expect_close(got, c.get(co, size_t(T * H)), {0, 0}, "embedding");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i)
      ASSERT_EQ(got[size_t(t * H + i)], table[size_t(ids[size_t(t)] * H + i)]) << "token " << t << " column " << i;
}

// The norm weight in the weight dtype, x and the residual in f32.
TEST_P(CudaF32Activations, AddRmsNorm) {
  for (int64_t H : {64, 4096, 4097}) {
    const int64_t T = 3;
    auto x = rnd(size_t(T * H)), d = rnd(size_t(T * H)), w = round_w(rnd(size_t(H)));
    Side& g = *gpu_;
    Side& c = *cpu_;
    void *gx = g.put(x), *cx = c.put(x), *go = g.put(std::vector<float>(size_t(T * H))),
         *co = c.put(std::vector<float>(size_t(T * H)));
    Mat gd = g.m(g.put(d), T, H), cd = c.m(c.put(d), T, H);
    gpu_be_->add_rmsnorm(g.m(gx, T, H), &gd, put_w(g, w), wt_, 1e-6f, g.m(go, T, H));
    cpu_be_->add_rmsnorm(c.m(cx, T, H), &cd, put_w(c, w), wt_, 1e-6f, c.m(co, T, H));
    expect_close(g.get(gx, size_t(T * H)), c.get(cx, size_t(T * H)), tol_for(DType::F32), "residual H=" + std::to_string(H));
    expect_close(g.get(go, size_t(T * H)), c.get(co, size_t(T * H)), tol_for(DType::F32), "norm H=" + std::to_string(H));
  }
}

// INT4 weights with 16-bit scales: the kernels read scales and x of one dtype, so the f32 backend
// refuses them by name (a Model refuses the engine before allocating: int4_scales).
TEST_P(CudaF32Activations, Int4WeightsWithSixteenBitScalesAreRefused) {
  EXPECT_FALSE(gpu_be_->int4_scales(wt_));
  EXPECT_TRUE(gpu_be_->int4_scales(DType::F32));
  const int64_t N = 16, K = 64;
  const Int4Weight w = random_int4(rng_, N, K, 32, false, false, wt_);
  Side& g = *gpu_;
  for (int64_t T : {1, 17}) {
    void *gx = g.put(rnd(size_t(T * K))), *gy = g.put(std::vector<float>(size_t(T * N)));
    test::expect_error([&] { gpu_be_->linear(g.m(gx, T, K), w.put(g, wt_), nullptr, g.m(gy, T, N)); },
                       {"INT4 scales are " + std::string(dtype_name(wt_)) + " on a f32 backend",
                        "INT4 weights need 16-bit activations, drop --activations f32"});
  }
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, CudaF32Activations, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ingot
#else
TEST(CudaF32Activations, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
