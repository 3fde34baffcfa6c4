// Op-level conformance of the CUDA backend's INT4 products against the CPU reference on the same
// packed weights: the decode kernel and the dequantize-then-cuBLASLt path, long rows, act-order, the
// dense product of the dequantized weight, and the refusals. Int4Weight::put re-lays each weight as a
// Model's load does (8-row blocks where rows % 8 == 0 and K % 128 == 0, else rows), so every case
// runs the layout a model of its shape gets; the shapes below cover both. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

// INT4 linear against the CPU reference on the same packed bytes, scales, zeros and perm, for every
// group size, both paths (the decode kernels up to 64 rows of 16-bit activations and 16 of f32,
// dequantize + cuBLASLt beyond, and always with a perm), with and without zero points, act-order and
// bias. K is an odd number of groups so the
// decode kernel's 128-column chunks end part-way, N not a multiple of its 8-row tiles.
TEST_P(CudaOps, Int4Linear) {
  int cases = 0;
  for (int64_t G : {32, 64, 128, 256})
    for (int64_t T : {1, 2, 7, 16, 17, 64, 65})
      for (int variant = 0; variant < 4; ++variant) {
        const bool zeros = variant & 1, perm = variant & 2, bias = (T + variant) % 2 == 0;
        const int64_t N = T == 7 ? 64 : 37, K = G * (G == 256 ? 3 : 5);
        const Int4Weight w = random_int4(rng_, N, K, G, zeros, perm, dt_);
        auto x = rnd(size_t(T * K)), b = rnd(size_t(N), 0.5f);
        Side& g = *gpu_;
        Side& c = *cpu_;
        gpu_be_->reserve_linear_scratch(gpu_be_->linear_scratch_bytes(DType::U8, N, K, T, perm));
        void *gy = g.put(std::vector<float>(size_t(T * N), 7.0f)), *cy = c.put(std::vector<float>(size_t(T * N)));
        gpu_be_->linear(g.m(g.put(x), T, K), w.put(g, dt_), bias ? g.put(b) : nullptr, g.m(gy, T, N));
        cpu_be_->linear(c.m(c.put(x), T, K), w.put(c, dt_), bias ? c.put(b, dt_) : nullptr, c.m(cy, T, N));
        const std::string what = "int4 linear G=" + std::to_string(G) + " T=" + std::to_string(T) + " N=" +
                                 std::to_string(N) + " K=" + std::to_string(K) + (zeros ? " zeros" : "") +
                                 (perm ? " perm" : "") + (bias ? " bias" : "");
        expect_close(g.get(gy, size_t(T * N)), c.get(cy, size_t(T * N)), tol(), what);
        ++cases;
      }
  EXPECT_EQ(cases, 112);
}

// Long rows (several steps of the decode kernel's loop over K, Llama-like K = 4096 and 14336), the
// batch instances (two, four and eight blocks of 8 token columns) and, past N = 8192, the splits of
// the widest products (two 16-row tiles a warp at 9..16 and 33..64 tokens; N = 8200 ends on a
// half tile, 8216 on a tile of the warp's pair past N). N = 4100 at 1 and 3 tokens takes the
// one-token split of 4 warps with four loads, K = 5120 giving it two unchecked steps and a checked half
// step. Wide shapes (N >= 4K) of 8-row blocks at 9..64 tokens take the GEMM (int4_gemm_kernel.cuh),
// whose split of K over a cluster at 9..32 tokens follows the block count: on a GPU of 132
// multiprocessors N = 17408 runs unsplit, 9216 over two blocks, 8200 and 2560 over four, where K = 640
// (5 quads over 4) leaves the last rank without a quad; at 33..64 tokens (40 and 64 here) it runs
// unsplit with two tiles a warp, N = 8216 ending on a tile of the warp's pair past N. At 9..32 tokens
// the GEMM applies the scale per stage (groups of 128), so the last three cases repeat GEMM shapes
// with zero points, whose integers nibble - zero it then multiplies unscaled.
TEST_P(CudaOps, Int4LinearLongRows) {
  for (auto [T, N, K, zeros] :
       {std::tuple<int64_t, int64_t, int64_t, bool>{1, 96, 4096, false}, {9, 40, 4096, false}, {4, 16, 14336, false},
        {16, 24, 14336, false}, {24, 40, 4096, false}, {64, 24, 14336, false}, {12, 8200, 1024, false},
        {30, 8200, 1024, false}, {40, 8216, 1024, false}, {64, 8200, 1024, false}, {1, 4100, 5120, false},
        {3, 4100, 5120, false}, {16, 17408, 256, false}, {40, 9216, 512, false}, {20, 2560, 640, false},
        {12, 8200, 1024, true}, {16, 17408, 256, true}, {30, 9216, 512, true}}) {
    const Int4Weight w = random_int4(rng_, N, K, 128, zeros, false, dt_);
    auto x = rnd(size_t(T * K));
    Side& g = *gpu_;
    Side& c = *cpu_;
    gpu_be_->reserve_linear_scratch(gpu_be_->linear_scratch_bytes(DType::U8, N, K, T, false));
    void *gy = g.put(std::vector<float>(size_t(T * N), 7.0f)), *cy = c.put(std::vector<float>(size_t(T * N)));
    gpu_be_->linear(g.m(g.put(x), T, K), w.put(g, dt_), nullptr, g.m(gy, T, N));
    cpu_be_->linear(c.m(c.put(x), T, K), w.put(c, dt_), nullptr, c.m(cy, T, N));
    expect_close(g.get(gy, size_t(T * N)), c.get(cy, size_t(T * N)), tol(),
                 "int4 linear T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                     (zeros ? " zeros" : ""));
  }
}

// The 1..64-token decode kernel (int4_gemv_kernel.cuh) against the CPU reference: every group size,
// Llama-like rows (K = 1024, 4096, 14336: one step, several, and a last step part-full for every
// split int4_linear.cu picks), odd N (16-row tiles cut short; one N of several blocks), zero points or
// none, bias or none, 1, 2, 5 and 8 tokens (B columns of the MMA past the call are not written) and
// 9, 12 and 16 (two token blocks, the second part-full or full), 17 and 32 (four, x reordered), 40 and
// 64 (eight). 16-bit only: f32 engines keep their own kernel.
TEST_P(CudaOps, Int4DecodeKernelMatchesTheCpu) {
  if (dt_ == DType::F32) GTEST_SKIP() << "the INT4 MMA decode kernel takes f16/bf16 activations";
  int cases = 0;
  for (int64_t G : {32, 64, 128, 256})
    for (int64_t K : {1024, 4096, 14336})
      for (int64_t T : {1, 2, 5, 8, 9, 12, 16, 17, 32, 40, 64}) {
        const bool zeros = (G / 32 + T) % 2 == 0, bias = (K / 1024 + T) % 2 == 1;
        // 40 rows: in 8-row blocks (one token at groups 64 and 128, every K); 37 and 333: in rows.
        const bool blocks = (K / 1024 + T + G / 64) % 2 == 1;
        const int64_t N = K == 4096 && T == 1 ? 333 : blocks ? 40 : 37;
        const Int4Weight w = random_int4(rng_, N, K, G, zeros, false, dt_);
        auto x = rnd(size_t(T * K)), b = rnd(size_t(N), 0.5f);
        Side& g = *gpu_;
        Side& c = *cpu_;
        void *gy = g.put(std::vector<float>(size_t(T * N), 7.0f)), *cy = c.put(std::vector<float>(size_t(T * N)));
        gpu_be_->reserve_linear_scratch(gpu_be_->linear_scratch_bytes(DType::U8, N, K, T, false));
        gpu_be_->linear(g.m(g.put(x), T, K), w.put(g, dt_), bias ? g.put(b) : nullptr, g.m(gy, T, N));
        cpu_be_->linear(c.m(c.put(x), T, K), w.put(c, dt_), bias ? c.put(b, dt_) : nullptr, c.m(cy, T, N));
        expect_close(g.get(gy, size_t(T * N)), c.get(cy, size_t(T * N)), tol(),
                     "int4 decode G=" + std::to_string(G) + " T=" + std::to_string(T) + " N=" + std::to_string(N) +
                         " K=" + std::to_string(K) + (zeros ? " zeros" : "") + (bias ? " bias" : ""));
        ++cases;
      }
  EXPECT_EQ(cases, 132);
}

// The gate/up product with the SwiGLU epilogue (launch_int4_gemv_swiglu) against the product followed
// by the swiglu op on the same backend, bit for bit, at every token count the decode kernel takes
// (one, two, four and eight token blocks), an odd intermediate size (the last 8-output tile cut
// short), a wide one (the splits past N = 8192), zero points or none; and against the CPU within the
// dtype's tolerance. f32 activations and more rows than the kernel takes go the unfused way.
TEST_P(CudaOps, Int4SwigluIsTheProductThenSwiglu) {
  int cases = 0;
  for (auto [I, K] : {std::pair<int64_t, int64_t>{37, 1024}, {4100, 1024}, {24, 4096}})
    for (int64_t T : {1, 5, 9, 16, 17, 32, 40, 64, 65}) {
      const bool zeros = (T + I) % 2 == 0;
      const Int4Weight w = random_int4(rng_, 2 * I, K, 128, zeros, false, dt_);
      auto x = rnd(size_t(T * K));
      Side& g = *gpu_;
      Side& c = *cpu_;
      gpu_be_->reserve_linear_scratch(gpu_be_->linear_scratch_bytes(DType::U8, 2 * I, K, T, false));
      const Mat wm = w.put(g, dt_), gx = g.m(g.put(x), T, K);
      void *fused = g.put(std::vector<float>(size_t(T * I), 7.0f)), *gu = g.put(std::vector<float>(size_t(T * 2 * I)));
      void* split = g.put(std::vector<float>(size_t(T * I), 5.0f));
      const bool took = gpu_be_->linear_swiglu(gx, wm, g.m(fused, T, I));
      // 9+ tokens on wide weights (2I >= 4K) in 8-row blocks take the GEMM, whose fused tile needs I a
      // multiple of 8.
      const bool gemm_declines = T > 8 && 2 * I >= 4 * K && I % 8 != 0 && wm.int4.layout == Int4Layout::Blocks8;
      EXPECT_EQ(took, dt_ != DType::F32 && T <= 64 && !gemm_declines) << "T=" << T;
      gpu_be_->linear(gx, wm, nullptr, g.m(gu, T, 2 * I));
      gpu_be_->swiglu(g.m(gu, T, 2 * I), g.m(split, T, I));
      const std::string what = "int4 swiglu T=" + std::to_string(T) + " I=" + std::to_string(I) + " K=" +
                               std::to_string(K) + (zeros ? " zeros" : "");
      if (took) EXPECT_EQ(g.get(fused, size_t(T * I)), g.get(split, size_t(T * I))) << what;
      void *cgu = c.put(std::vector<float>(size_t(T * 2 * I))), *cy = c.put(std::vector<float>(size_t(T * I)));
      cpu_be_->linear(c.m(c.put(x), T, K), w.put(c, dt_), nullptr, c.m(cgu, T, 2 * I));
      cpu_be_->swiglu(c.m(cgu, T, 2 * I), c.m(cy, T, I));
      expect_close(g.get(split, size_t(T * I)), c.get(cy, size_t(T * I)), tol(), what);
      ++cases;
    }
  EXPECT_EQ(cases, 27);
}

// The wide path's dequantized weight is exactly round_dt((nibble - zero) * scale) in input column order:
// its product equals the dense linear over those values bit for bit (same cuBLASLt plan), perm included.
TEST_P(CudaOps, Int4WidePathIsTheDenseProductOfItsDequantizedWeight) {
  for (bool perm : {false, true}) {
    const int64_t T = 80, N = 48, K = 384, G = 64;  // past the decode kernels' 64 rows
    const Int4Weight w = random_int4(rng_, N, K, G, true, perm, dt_, false);
    auto x = rnd(size_t(T * K));
    Side& g = *gpu_;
    gpu_be_->reserve_linear_scratch(gpu_be_->linear_scratch_bytes(DType::U8, N, K, T, perm));
    void* gx = g.put(x);
    void *q = g.put(std::vector<float>(size_t(T * N))), *d = g.put(std::vector<float>(size_t(T * N)));
    gpu_be_->linear(g.m(gx, T, K), w.put(g, dt_), nullptr, g.m(q, T, N));
    gpu_be_->linear(g.m(gx, T, K), g.m(g.put(w.dense(dt_)), N, K), nullptr, g.m(d, T, N));
    EXPECT_EQ(g.get(q, size_t(T * N)), g.get(d, size_t(T * N))) << (perm ? "perm" : "no perm");
  }
}

// The decode kernel with scales whose products round in 16 bits: against the dense product over the
// host's round_dt((nibble - zero) * scale) on the GPU, within the dtype's tolerance (the two differ in
// accumulation order and kernel, not in weights).
TEST_P(CudaOps, Int4DecodeMatchesTheDenseProductOfItsDequantizedWeight) {
  for (int64_t T : {1, 5, 9, 16, 24, 64}) {
    const int64_t N = 72, K = 1024, G = 128;
    const Int4Weight w = random_int4(rng_, N, K, G, true, false, dt_, false);
    auto x = rnd(size_t(T * K));
    Side& g = *gpu_;
    gpu_be_->reserve_linear_scratch(gpu_be_->linear_scratch_bytes(DType::U8, N, K, T, false));
    void* gx = g.put(x);
    void *q = g.put(std::vector<float>(size_t(T * N), 7.0f)), *d = g.put(std::vector<float>(size_t(T * N)));
    gpu_be_->linear(g.m(gx, T, K), w.put(g, dt_), nullptr, g.m(q, T, N));
    gpu_be_->linear(g.m(gx, T, K), g.m(g.put(w.dense(dt_)), N, K), nullptr, g.m(d, T, N));
    expect_close(g.get(q, size_t(T * N)), g.get(d, size_t(T * N)), tol(), "int4 decode T=" + std::to_string(T));
  }
}

// A graph captured over a 17..64-row product holds the address of the scratch x is reordered into; a
// later, larger reservation (another Model on the backend) must not free it: the graph would then
// write memory handed out since (here, possibly a new buffer of the same size), and the product and
// that buffer would both be at risk.
TEST_P(CudaOps, Int4GraphKeepsItsScratchWhenTheScratchGrows) {
  if (dt_ == DType::F32) GTEST_SKIP() << "f32 activations take no scratch at 20 rows";
  const int64_t T = 20, N = 48, K = 256;
  const Int4Weight w = random_int4(rng_, N, K, 64, true, false, dt_);
  Side& g = *gpu_;
  const size_t small = gpu_be_->linear_scratch_bytes(DType::U8, N, K, T, false);
  ASSERT_GT(small, 0u);
  gpu_be_->reserve_linear_scratch(small);
  void *gx = g.put(rnd(size_t(T * K))), *gy = g.put(std::vector<float>(size_t(T * N)));
  const Mat wm = w.put(g, dt_);
  gpu_be_->linear(g.m(gx, T, K), wm, nullptr, g.m(gy, T, N));
  const std::vector<float> direct = g.get(gy, size_t(T * N));
  auto graph = gpu_be_->capture([&] { gpu_be_->linear(g.m(gx, T, K), wm, nullptr, g.m(gy, T, N)); });
  ASSERT_NE(graph, nullptr);
  gpu_be_->reserve_linear_scratch(small * 64);
  const std::vector<float> marks(small / dtype_size(dt_), 3.0f);
  void* victim = g.put(marks);  // the size of the first scratch
  graph->replay();
  EXPECT_EQ(g.get(gy, size_t(T * N)), direct);
  EXPECT_EQ(g.get(victim, marks.size()), marks) << "the replay wrote a buffer allocated after the scratch grew";
}

// The CUDA backend's re-layout at load is the documented byte order (backend.h): every 32-bit word's
// nibbles paired (value 2c in nibble c, 2c + 1 in nibble c + 4: Int4Scales::paired), and row 8b + g's
// 16-byte piece 4Q + t at ((b * K/128 + Q) * 32 + 4g + t) * 16 (Int4Layout::Blocks8); weights the
// blocks do not apply to (rows % 8, K % 128) keep their rows, paired.
TEST_P(CudaOps, Int4LoadRelayoutIsTheDocumentedByteOrder) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{24, 384}, {16, 14336}, {37, 384}, {24, 320}}) {
    const Int4Weight w = random_int4(rng_, N, K, 64, false, false, dt_);
    Side& g = *gpu_;
    const Mat m = w.put(g, dt_);
    const bool blocks = N % 8 == 0 && K % 128 == 0;
    EXPECT_EQ(m.int4.layout, blocks ? Int4Layout::Blocks8 : Int4Layout::Rows) << N << " x " << K;
    EXPECT_TRUE(m.int4.paired) << N << " x " << K;
    std::vector<uint8_t> got(w.packed.size());
    gpu_be_->download(got.data(), m.data, got.size());
    std::vector<uint8_t> paired = w.packed;
    for (size_t i = 0; i < paired.size(); i += 4) {  // little-endian words
      uint32_t v = 0, o = 0;
      std::memcpy(&v, &paired[i], 4);
      for (int c = 0; c < 8; ++c) o |= ((v >> (4 * c)) & 0xfu) << (4 * (c / 2 + 4 * (c % 2)));
      std::memcpy(&paired[i], &o, 4);
    }
    std::vector<uint8_t> want = paired;
    if (blocks)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < K / 32; ++p)
          std::memcpy(&want[size_t(((n / 8 * (K / 128) + p / 4) * 32 + 4 * (n % 8) + p % 4) * 16)],
                      &paired[size_t(n * (K / 2) + p * 16)], 16);
    EXPECT_EQ(got, want) << N << " x " << K;
  }
}

TEST_P(CudaOps, Int4LinearRefusesWhatItCannotRun) {
  const int64_t rows = dt_ == DType::F32 ? 16 : 64;  // the decode kernels' rows (int4_decode_rows)
  const int64_t T = rows + 1, N = 16, K = 64;
  Int4Weight w = random_int4(rng_, N, K, 32, false, false, dt_);
  Side& g = *gpu_;
  void *gx = g.put(rnd(size_t(T * K))), *gy = g.put(std::vector<float>(size_t(T * N)));
  // The decode kernel reads the packed bytes (up to 8 rows with no scratch; 16-bit x past that: x in
  // fragment order for the GEMM or the kernel, [ceil(K / 128) x 128 columns, rows in blocks of 8] of
  // 16 bits); a perm always takes the dequantized weight.
  EXPECT_EQ(gpu_be_->linear_scratch_bytes(DType::U8, N, K, 8, false), 0u);
  EXPECT_EQ(gpu_be_->linear_scratch_bytes(DType::U8, N, K, 16, false), dt_ == DType::F32 ? 0u : 128u * 16u * 2u);
  EXPECT_EQ(gpu_be_->linear_scratch_bytes(DType::U8, N, K, rows, false), dt_ == DType::F32 ? 0u : 128u * 64u * 2u);
  EXPECT_EQ(gpu_be_->linear_scratch_bytes(DType::U8, N, K, 16, true), size_t(N * K) * dtype_size(dt_));
  // More rows than the decode kernels take, without the scratch a Model reserves.
  test::expect_error([&] { gpu_be_->linear(g.m(gx, T, K), w.put(g, dt_), nullptr, g.m(gy, T, N)); },
                     {"INT4 weight [16, 64] over " + std::to_string(T) + " rows needs " +
                          std::to_string(N * K * int64_t(dtype_size(dt_))) + " bytes",
                      "reserve_linear_scratch"});
  // A group size the kernels do not take, scales in another dtype, packed rows of the wrong length.
  Mat bad = w.put(g, dt_);
  bad.int4.group_size = 16;
  test::expect_error([&] { gpu_be_->linear(g.m(gx, 1, K), bad, nullptr, g.m(gy, 1, N)); },
                     {"INT4 group size 16 must be a power of two in [32, 256]"});
  const DType other = dt_ == DType::F32 ? DType::BF16 : DType::F32;
  test::expect_error([&] { gpu_be_->linear(g.m(gx, 1, K), w.put(g, other), nullptr, g.m(gy, 1, N)); },
                     {"INT4 scales are " + std::string(dtype_name(other))});
  bad = w.put(g, dt_);
  bad.ld = K;
  test::expect_error([&] { gpu_be_->linear(g.m(gx, 1, K), bad, nullptr, g.m(gy, 1, N)); }, {"has rows of 32 bytes, not 64"});
  // A weight in quant/int4.h's nibble order, not re-laid out at load.
  bad = w.put(g, dt_);
  ASSERT_TRUE(bad.int4.paired);
  bad.int4.paired = false;
  test::expect_error([&] { gpu_be_->linear(g.m(gx, 1, K), bad, nullptr, g.m(gy, 1, N)); },
                     {"INT4 weight [16, 64] in quant/int4.h's nibble order", "relayout_int4"});
  // 8-row blocks claimed for a weight they cannot hold (64 columns: not whole 128-column quads).
  bad = w.put(g, dt_);
  ASSERT_EQ(bad.int4.layout, Int4Layout::Rows);
  bad.int4.layout = Int4Layout::Blocks8;
  test::expect_error([&] { gpu_be_->linear(g.m(gx, 1, K), bad, nullptr, g.m(gy, 1, N)); },
                     {"INT4 weight [16, 64] in 8-row blocks needs rows % 8 == 0 and columns % 128 == 0"});
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ingot
#else
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
