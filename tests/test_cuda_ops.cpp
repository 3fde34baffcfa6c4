// Op-level conformance of the CUDA backend against the CPU reference backend: every op on random
// shapes (odd sizes, GQA, rows at different write indices, sliding windows, the all-masked row, both
// cache layouts), f32 with tight tolerances and f16/bf16 with tolerances of their rounding; the sample
// op picks exactly the CPU's tokens. Inputs are rounded to the tested dtype first, so both backends see
// the same values. Skips without a GPU.
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
#include "cuda_test_helpers.h"
#include "test_helpers.h"

#ifdef INGOT_WITH_CUDA
namespace ingot {
namespace {

using test::expect_close;
using test::Side;
using test::Tol;
using test::tol_for;

// A cache of `B` rows with every slot random, in either layout.
struct CacheSpec {
  int64_t B, kv_heads, capacity, head_dim;
  bool heads_first;
  KvLayerView view(void* k, void* v, DType dt) const {
    KvLayerView c;
    c.k = k;
    c.v = v;
    c.dtype = dt;
    c.capacity = capacity;
    c.batch_stride = kv_heads * capacity * head_dim;
    c.head_stride = heads_first ? capacity * head_dim : head_dim;
    c.slot_stride = heads_first ? head_dim : kv_heads * head_dim;
    return c;
  }
  size_t elems() const { return size_t(B * kv_heads * capacity * head_dim); }
};

// Tokens of several rows: (row, first slot, count, kv_len after the call).
struct Chunk {
  int row, start, len;
};

struct Meta {
  std::vector<int32_t> row, slot, pos, kv_len;
};

Meta make_meta(const std::vector<Chunk>& chunks) {
  Meta m;
  for (const Chunk& c : chunks)
    for (int i = 0; i < c.len; ++i) {
      m.row.push_back(c.row);
      m.slot.push_back(c.start + i);
      m.pos.push_back(c.start + i);
      m.kv_len.push_back(c.start + c.len);
    }
  return m;
}

TokenMeta put_meta(Side& s, const Meta& m) {
  return {s.put_i32(m.row), s.put_i32(m.slot), s.put_i32(m.pos), s.put_i32(m.kv_len)};
}

class CudaOps : public test::CudaVsCpu {
 protected:
  // Normal values rounded to the tested dtype.
  std::vector<float> rnd(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return round_dt(v);
  }
  std::vector<float> round_dt(std::vector<float> v) {
    std::vector<uint8_t> raw(v.size() * dtype_size(dt_));
    convert_from_f32(dt_, v.data(), raw.data(), v.size());
    convert_to_f32(dt_, raw.data(), v.data(), v.size());
    return v;
  }
  Tol tol() const { return tol_for(dt_); }

  // Attention on both backends over the same random q (scaled by q_scale) and cache. The GPU output
  // starts at 7 so a token the kernel never writes shows. rows: the hint of distinct cache rows.
  struct AttnRun {
    AttentionParams gpu;
    std::vector<float> got, want;
  };
  AttnRun attention_both(const CacheSpec& cspec, const Meta& meta, int q_heads, int window, bool bound_is_capacity,
                         int rows, float q_scale = 1.0f) {
    const int64_t T = int64_t(meta.row.size()), QD = int64_t(q_heads) * cspec.head_dim;
    int max_kv = 0;
    for (int32_t l : meta.kv_len) max_kv = std::max(max_kv, int(l));
    auto q = rnd(size_t(T * QD), q_scale), kc = rnd(cspec.elems()), vc = rnd(cspec.elems());
    Side& g = *gpu_;
    Side& c = *cpu_;
    AttnRun r;
    AttentionParams cp;
    void *go = g.put(std::vector<float>(size_t(T * QD), 7.0f)), *co = c.put(std::vector<float>(size_t(T * QD)));
    for (auto [p, s, o] : {std::tuple{&r.gpu, &g, go}, std::tuple{&cp, &c, co}}) {
      p->q = s->m(s->put(q), T, QD);
      p->out = s->m(o, T, QD);
      p->q_heads = q_heads;
      p->kv_heads = int(cspec.kv_heads);
      p->head_dim = int(cspec.head_dim);
      p->window = window;
      p->scale = 1.0f / std::sqrt(float(cspec.head_dim));
      p->max_kv_len = bound_is_capacity ? int(cspec.capacity) : max_kv;
      p->rows = rows;
      p->meta = put_meta(*s, meta);
      p->cache = cspec.view(s->put(kc), s->put(vc), s->dt);
    }
    gpu_be_->attention(r.gpu);
    cpu_be_->attention(cp);
    r.got = g.get(go, size_t(T * QD));
    r.want = c.get(co, size_t(T * QD));
    return r;
  }

  std::mt19937 rng_{42};
};

TEST_P(CudaOps, Embedding) {
  const int64_t V = 37, H = 67, T = 5;
  auto table = rnd(size_t(V * H));
  std::vector<int32_t> ids = {0, 36, 5, 5, 17};
  Side& g = *gpu_;
  Side& c = *cpu_;
  void* go = g.put(std::vector<float>(size_t(T * H)));
  void* co = c.put(std::vector<float>(size_t(T * H)));
  gpu_be_->embedding(g.m(g.put(table), V, H), g.put_i32(ids), g.m(go, T, H));
  cpu_be_->embedding(c.m(c.put(table), V, H), c.put_i32(ids), c.m(co, T, H));
  expect_close(g.get(go, size_t(T * H)), c.get(co, size_t(T * H)), {0, 0}, "embedding");
}

TEST_P(CudaOps, AddRmsNorm) {
  // Widths of whole 16-byte vectors take the vector kernel (one to four vectors a thread); 4097, 16392
  // (five vectors a thread in 16 bits) and 16384 in f32 the scalar one.
  for (int64_t H : {64, 1000, 4096, 4097, 16384, 16392}) {
    for (bool with_delta : {false, true}) {
      const int64_t T = 3;
      auto x = rnd(size_t(T * H)), d = rnd(size_t(T * H)), w = rnd(size_t(H));
      Side& g = *gpu_;
      Side& c = *cpu_;
      void *gx = g.put(x), *cx = c.put(x), *go = g.put(std::vector<float>(size_t(T * H))),
           *co = c.put(std::vector<float>(size_t(T * H)));
      Mat gd = g.m(g.put(d), T, H), cd = c.m(c.put(d), T, H);
      gpu_be_->add_rmsnorm(g.m(gx, T, H), with_delta ? &gd : nullptr, g.put(w), dt_, 1e-6f, g.m(go, T, H));
      cpu_be_->add_rmsnorm(c.m(cx, T, H), with_delta ? &cd : nullptr, c.put(w), DType::F32, 1e-6f, c.m(co, T, H));
      // The CPU residual stays f32; the GPU's is rounded to the activation dtype like the model's.
      expect_close(g.get(gx, size_t(T * H)), round_dt(c.get(cx, size_t(T * H))), tol(), "residual H=" + std::to_string(H));
      expect_close(g.get(go, size_t(T * H)), c.get(co, size_t(T * H)), tol(), "norm H=" + std::to_string(H));
    }
  }
}

TEST_P(CudaOps, Linear) {
  struct Shape {
    int64_t T, N, K;
    bool bias;
  };
  // One token (the GEMV kernel: each split of K it takes, one, two and four warps per row, with their
  // full and tail steps and a last block of rows past N), odd K (cuBLASLt fallback) and more tokens
  // (cuBLASLt).
  for (Shape s : {Shape{1, 37, 64, false}, Shape{1, 129, 1024, true}, Shape{1, 70, 1096, false},
                  Shape{1, 33, 2048, true}, Shape{1, 131, 3072, false}, Shape{1, 65, 4104, true},
                  Shape{3, 129, 1096, true}, Shape{8, 70, 2048, false},
                  Shape{5, 33, 67, true}, Shape{17, 70, 130, false}, Shape{64, 256, 512, true}}) {
    auto x = rnd(size_t(s.T * s.K)), w = rnd(size_t(s.N * s.K), 0.05f), b = rnd(size_t(s.N));
    Side& g = *gpu_;
    Side& c = *cpu_;
    void *gy = g.put(std::vector<float>(size_t(s.T * s.N))), *cy = c.put(std::vector<float>(size_t(s.T * s.N)));
    gpu_be_->linear(g.m(g.put(x), s.T, s.K), g.m(g.put(w), s.N, s.K), s.bias ? g.put(b) : nullptr, g.m(gy, s.T, s.N));
    cpu_be_->linear(c.m(c.put(x), s.T, s.K), c.m(c.put(w), s.N, s.K), s.bias ? c.put(b) : nullptr, c.m(cy, s.T, s.N));
    expect_close(g.get(gy, size_t(s.T * s.N)), c.get(cy, size_t(s.T * s.N)), tol(),
                 "linear T=" + std::to_string(s.T) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
  }
}

// The fused gate/up product + SwiGLU of one-token decode equals the two ops it replaces bit for bit on
// the GPU (the same split of K as the plain GEMV, so the same accumulation, and the same roundings), and
// the CPU's two ops within tolerance. More tokens go to cuBLASLt: the fused op declines them.
TEST_P(CudaOps, LinearSwigluMatchesTwoOps) {
  struct Shape {
    int64_t T, I, K;
  };
  for (Shape s : {Shape{1, 96, 64}, Shape{1, 37, 1096}, Shape{1, 300, 2048}, Shape{1, 3072, 1024},
                  Shape{1, 77, 3072}, Shape{1, 130, 4104}}) {
    auto x = rnd(size_t(s.T * s.K)), w = rnd(size_t(2 * s.I * s.K), 0.05f);
    Side& g = *gpu_;
    Side& c = *cpu_;
    void *gx = g.put(x), *gw = g.put(w);
    void *fused = g.put(std::vector<float>(size_t(s.T * s.I))), *gu = g.put(std::vector<float>(size_t(s.T * 2 * s.I)));
    void *two = g.put(std::vector<float>(size_t(s.T * s.I)));
    ASSERT_TRUE(gpu_be_->linear_swiglu(g.m(gx, s.T, s.K), g.m(gw, 2 * s.I, s.K), g.m(fused, s.T, s.I)));
    gpu_be_->linear(g.m(gx, s.T, s.K), g.m(gw, 2 * s.I, s.K), nullptr, g.m(gu, s.T, 2 * s.I));
    gpu_be_->swiglu(g.m(gu, s.T, 2 * s.I), g.m(two, s.T, s.I));
    const std::string what = "linear_swiglu T=" + std::to_string(s.T) + " I=" + std::to_string(s.I) +
                             " K=" + std::to_string(s.K);
    const auto got = g.get(fused, size_t(s.T * s.I));
    EXPECT_EQ(got, g.get(two, size_t(s.T * s.I))) << what;
    void *cgu = c.put(std::vector<float>(size_t(s.T * 2 * s.I))), *cy = c.put(std::vector<float>(size_t(s.T * s.I)));
    EXPECT_FALSE(cpu_be_->linear_swiglu(c.m(c.put(x), s.T, s.K), c.m(c.put(w), 2 * s.I, s.K), c.m(cy, s.T, s.I)));
    cpu_be_->linear(c.m(c.put(x), s.T, s.K), c.m(c.put(w), 2 * s.I, s.K), nullptr, c.m(cgu, s.T, 2 * s.I));
    cpu_be_->swiglu(c.m(cgu, s.T, 2 * s.I), c.m(cy, s.T, s.I));
    expect_close(got, c.get(cy, size_t(s.T * s.I)), tol(), what);
  }
  for (int64_t T : {2, 8}) {
    Side& g = *gpu_;
    void* gx = g.put(rnd(size_t(T * 64)));
    void* gw = g.put(rnd(size_t(2 * 32 * 64), 0.05f));
    void* out = g.put(std::vector<float>(size_t(T * 32)));
    EXPECT_FALSE(gpu_be_->linear_swiglu(g.m(gx, T, 64), g.m(gw, 64, 64), g.m(out, T, 32))) << "T=" << T;
  }
}

TEST_P(CudaOps, LinearRejectsMixedDtypes) {
  if (dt_ == DType::F32) GTEST_SKIP() << "mixed dtypes need a 16-bit backend";
  Buffer w(*gpu_be_, 16 * 16 * 4), x(*gpu_be_, 16 * 2), y(*gpu_be_, 16 * 2);
  EXPECT_THROW(gpu_be_->linear(mat(x.get(), dt_, 1, 16), mat(w.get(), DType::F32, 16, 16), nullptr, mat(y.get(), dt_, 1, 16)),
               Error);
}

// The gated attention output (Qwen3.5): x * sigmoid(gate) with the gate a strided column view of a
// wider buffer, in place, as the model runs it.
// A random INT4 weight [N, K] in the runtime layout (quant/int4.h) with everything a linear reads.
struct Int4Weight {
  int64_t N, K, G;
  std::vector<uint8_t> packed;   // [N, K/2] every nibble 0..15 (nibble 0 included: it is legal input)
  std::vector<float> scales;     // [N, K/G] positive, rounded to the tested dtype
  std::vector<uint8_t> zeros;    // [N, K/G] in 0..15, or empty (zero 8)
  std::vector<int32_t> perm;     // [K] a permutation, or empty
  // The dense weight a 16-bit (or f32) product would read: round_dt((nibble - zero) * scale) with the
  // columns in input order (w[n, perm[j]] = stored column j).
  std::vector<float> dense(DType dt) const {
    std::vector<float> w(size_t(N * K));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) {
        const int nib = (packed[size_t(n * K / 2 + j / 2)] >> (4 * (j % 2))) & 0xf;
        const int z = zeros.empty() ? 8 : zeros[size_t(n * (K / G) + j / G)];
        w[size_t(n * K + (perm.empty() ? j : perm[size_t(j)]))] = float(nib - z) * scales[size_t(n * (K / G) + j / G)];
      }
    std::vector<uint8_t> raw(w.size() * dtype_size(dt));
    convert_from_f32(dt, w.data(), raw.data(), w.size());
    convert_to_f32(dt, raw.data(), w.data(), w.size());
    return w;
  }
  // The weight as a Mat on `s`, scales (and bias) in dtype `dt`.
  Mat put(Side& s, DType dt) const {
    s.keep.emplace_back(s.be, packed.size());
    s.be.upload(s.keep.back().get(), packed.data(), packed.size());
    Mat m{s.keep.back().get(), DType::U8, N, K, K / 2};
    m.int4.data = s.put(scales, dt);
    m.int4.dtype = dt;
    m.int4.group_size = G;
    if (!zeros.empty()) {
      s.keep.emplace_back(s.be, zeros.size());
      s.be.upload(s.keep.back().get(), zeros.data(), zeros.size());
      m.int4.zeros = s.keep.back().as<uint8_t>();
    }
    if (!perm.empty()) m.int4.perm = s.put_i32(perm);
    return m;
  }
};

// exact: scales m / 1024 with m in 1..15, so that every (nibble - zero) * scale has at most 8
// significant bits and is exact in f16 and bf16 too: the GPU's 16-bit weights then equal the CPU's f32
// ones, and a comparison sees only the accumulation and the output rounding (as for 16-bit weights).
// Otherwise scales are any values (the dequantization's rounding is then checked bit for bit elsewhere).
Int4Weight random_int4(std::mt19937& rng, int64_t N, int64_t K, int64_t G, bool zeros, bool perm, DType dt,
                       bool exact = true) {
  Int4Weight w{N, K, G, {}, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255), nib(0, 15), m(1, 15);
  std::uniform_real_distribution<float> sc(0.001f, 0.015f);
  w.packed.resize(size_t(N * K / 2));
  for (uint8_t& b : w.packed) b = uint8_t(byte(rng));
  w.scales.resize(size_t(N * (K / G)));
  for (float& v : w.scales) v = exact ? float(m(rng)) / 1024.0f : sc(rng);
  std::vector<uint8_t> raw(w.scales.size() * dtype_size(dt));
  convert_from_f32(dt, w.scales.data(), raw.data(), w.scales.size());
  convert_to_f32(dt, raw.data(), w.scales.data(), w.scales.size());
  if (zeros) {
    w.zeros.resize(w.scales.size());
    for (uint8_t& z : w.zeros) z = uint8_t(nib(rng));
  }
  if (perm) {
    w.perm.resize(size_t(K));
    for (int64_t j = 0; j < K; ++j) w.perm[size_t(j)] = int32_t(j);
    std::shuffle(w.perm.begin(), w.perm.end(), rng);
  }
  return w;
}

// INT4 linear against the CPU reference on the same packed bytes, scales, zeros and perm, for every
// group size, both paths (the decode kernel up to 16 rows, dequantize + cuBLASLt beyond, and always
// with a perm), with and without zero points, act-order and bias. K is an odd number of groups so the
// decode kernel's 128-column chunks end part-way, N not a multiple of its 8-row tiles.
TEST_P(CudaOps, Int4Linear) {
  int cases = 0;
  for (int64_t G : {32, 64, 128, 256})
    for (int64_t T : {1, 2, 7, 16, 17, 64})
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
  EXPECT_EQ(cases, 96);
}

// Long rows (several steps of the decode kernel's loop over K, Llama-like K = 4096 and 14336) and the
// 8..16-token half of its tiles.
TEST_P(CudaOps, Int4LinearLongRows) {
  for (auto [T, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 96, 4096}, {9, 40, 4096}, {4, 16, 14336}}) {
    const Int4Weight w = random_int4(rng_, N, K, 128, false, false, dt_);
    auto x = rnd(size_t(T * K));
    Side& g = *gpu_;
    Side& c = *cpu_;
    void *gy = g.put(std::vector<float>(size_t(T * N), 7.0f)), *cy = c.put(std::vector<float>(size_t(T * N)));
    gpu_be_->linear(g.m(g.put(x), T, K), w.put(g, dt_), nullptr, g.m(gy, T, N));
    cpu_be_->linear(c.m(c.put(x), T, K), w.put(c, dt_), nullptr, c.m(cy, T, N));
    expect_close(g.get(gy, size_t(T * N)), c.get(cy, size_t(T * N)), tol(),
                 "int4 linear T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  }
}

// The 1..8-token decode kernel (int4_gemv_kernel.cuh) against the CPU reference: every group size,
// Llama-like rows (K = 1024, 4096, 14336: one step, several, and a last step part-full for every
// split int4_linear.cu picks), odd N (16-row tiles cut short; one N of several blocks), zero points or
// none, bias or none, 1, 2, 5 and 8 tokens (B columns of the MMA past the call are zeros). 16-bit only:
// f32 engines keep their own kernel.
TEST_P(CudaOps, Int4DecodeKernelMatchesTheCpu) {
  if (dt_ == DType::F32) GTEST_SKIP() << "the INT4 MMA decode kernel takes f16/bf16 activations";
  int cases = 0;
  for (int64_t G : {32, 64, 128, 256})
    for (int64_t K : {1024, 4096, 14336})
      for (int64_t T : {1, 2, 5, 8}) {
        const bool zeros = (G / 32 + T) % 2 == 0, bias = (K / 1024 + T) % 2 == 1;
        const int64_t N = K == 4096 && T == 1 ? 333 : 37;
        const Int4Weight w = random_int4(rng_, N, K, G, zeros, false, dt_);
        auto x = rnd(size_t(T * K)), b = rnd(size_t(N), 0.5f);
        Side& g = *gpu_;
        Side& c = *cpu_;
        void *gy = g.put(std::vector<float>(size_t(T * N), 7.0f)), *cy = c.put(std::vector<float>(size_t(T * N)));
        gpu_be_->linear(g.m(g.put(x), T, K), w.put(g, dt_), bias ? g.put(b) : nullptr, g.m(gy, T, N));
        cpu_be_->linear(c.m(c.put(x), T, K), w.put(c, dt_), bias ? c.put(b, dt_) : nullptr, c.m(cy, T, N));
        expect_close(g.get(gy, size_t(T * N)), c.get(cy, size_t(T * N)), tol(),
                     "int4 decode G=" + std::to_string(G) + " T=" + std::to_string(T) + " N=" + std::to_string(N) +
                         " K=" + std::to_string(K) + (zeros ? " zeros" : "") + (bias ? " bias" : ""));
        ++cases;
      }
  EXPECT_EQ(cases, 48);
}

// The wide path's dequantized weight is exactly round_dt((nibble - zero) * scale) in input column order:
// its product equals the dense linear over those values bit for bit (same cuBLASLt plan), perm included.
TEST_P(CudaOps, Int4WidePathIsTheDenseProductOfItsDequantizedWeight) {
  for (bool perm : {false, true}) {
    const int64_t T = 40, N = 48, K = 384, G = 64;
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
  for (int64_t T : {1, 5, 16}) {
    const int64_t N = 72, K = 1024, G = 128;
    const Int4Weight w = random_int4(rng_, N, K, G, true, false, dt_, false);
    auto x = rnd(size_t(T * K));
    Side& g = *gpu_;
    void* gx = g.put(x);
    void *q = g.put(std::vector<float>(size_t(T * N), 7.0f)), *d = g.put(std::vector<float>(size_t(T * N)));
    gpu_be_->linear(g.m(gx, T, K), w.put(g, dt_), nullptr, g.m(q, T, N));
    gpu_be_->linear(g.m(gx, T, K), g.m(g.put(w.dense(dt_)), N, K), nullptr, g.m(d, T, N));
    expect_close(g.get(q, size_t(T * N)), g.get(d, size_t(T * N)), tol(), "int4 decode T=" + std::to_string(T));
  }
}

TEST_P(CudaOps, Int4LinearRefusesWhatItCannotRun) {
  const int64_t T = 17, N = 16, K = 64;
  Int4Weight w = random_int4(rng_, N, K, 32, false, false, dt_);
  Side& g = *gpu_;
  void *gx = g.put(rnd(size_t(T * K))), *gy = g.put(std::vector<float>(size_t(T * N)));
  EXPECT_EQ(gpu_be_->linear_scratch_bytes(DType::U8, N, K, 16, false), 0u);  // the decode kernel reads the packed bytes
  EXPECT_EQ(gpu_be_->linear_scratch_bytes(DType::U8, N, K, 16, true), size_t(N * K) * dtype_size(dt_));
  // More than 16 rows without the scratch a Model reserves.
  test::expect_error([&] { gpu_be_->linear(g.m(gx, T, K), w.put(g, dt_), nullptr, g.m(gy, T, N)); },
                     {"INT4 weight [16, 64] over 17 rows needs " + std::to_string(N * K * int64_t(dtype_size(dt_))) + " bytes",
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
}

TEST_P(CudaOps, SigmoidGateInPlaceOnStridedGate) {
  const int64_t T = 5, N = 48, LD = 3 * N;  // gates in columns [2N, 3N) of a [T, 3N] buffer
  auto x = rnd(size_t(T * N)), wide = rnd(size_t(T * LD));
  Side& g = *gpu_;
  Side& c = *cpu_;
  void *gx = g.put(x), *cx = c.put(x);
  auto gate = [&](Side& s, void* p) {
    return Mat{static_cast<uint8_t*>(p) + size_t(2 * N) * dtype_size(s.dt), s.dt, T, N, LD};
  };
  gpu_be_->sigmoid_gate(g.m(gx, T, N), gate(g, g.put(wide)), g.m(gx, T, N));
  cpu_be_->sigmoid_gate(c.m(cx, T, N), gate(c, c.put(wide)), c.m(cx, T, N));
  expect_close(g.get(gx, size_t(T * N)), c.get(cx, size_t(T * N)), tol(), "sigmoid_gate");
}

TEST_P(CudaOps, SwigluGatherFeedArgmax) {
  const int64_t T = 4, I = 33, V = 1001;
  auto gu = rnd(size_t(T * 2 * I));
  Side& g = *gpu_;
  Side& c = *cpu_;
  void *go = g.put(std::vector<float>(size_t(T * I))), *co = c.put(std::vector<float>(size_t(T * I)));
  gpu_be_->swiglu(g.m(g.put(gu), T, 2 * I), g.m(go, T, I));
  cpu_be_->swiglu(c.m(c.put(gu), T, 2 * I), c.m(co, T, I));
  expect_close(g.get(go, size_t(T * I)), c.get(co, size_t(T * I)), tol(), "swiglu");

  std::vector<int32_t> idx = {3, 0, 3};
  void *gd = g.put(std::vector<float>(size_t(3 * I))), *cd = c.put(std::vector<float>(size_t(3 * I)));
  gpu_be_->gather_rows(g.m(go, T, I), g.put_i32(idx), g.m(gd, 3, I));
  cpu_be_->gather_rows(c.m(co, T, I), c.put_i32(idx), c.m(cd, 3, I));
  expect_close(g.get(gd, size_t(3 * I)), c.get(cd, size_t(3 * I)), tol(), "gather_rows");

  // feed_picks: fed rows take the pick they name (a missing pick, -1, as token 0), the rest keep theirs.
  {
    const std::vector<int32_t> picks = {41, -1, 7, 300}, from = {2, -1, 1, 0, -1, 3}, ids = {5, 6, 8, 9, 10, 11};
    int32_t* gi = g.put_i32(ids);
    int32_t* ci = c.put_i32(ids);
    gpu_be_->feed_picks(g.put_i32(picks), g.put_i32(from), int64_t(from.size()), gi);
    cpu_be_->feed_picks(c.put_i32(picks), c.put_i32(from), int64_t(from.size()), ci);
    const std::vector<int32_t> fed = g.get_i32(gi, ids.size());
    EXPECT_EQ(fed, c.get_i32(ci, ids.size()));
    EXPECT_EQ(fed, (std::vector<int32_t>{7, 6, 0, 41, 10, 300}));
  }

  // Ties: the lowest index wins, whichever thread saw it.
  auto lg = rnd(size_t(T * V));
  lg[size_t(0 * V + 700)] = 9.0f;
  lg[size_t(0 * V + 3)] = 9.0f;
  lg[size_t(1 * V + 1000)] = 9.0f;
  for (int64_t j = 0; j < V; ++j) lg[size_t(2 * V + j)] = 0.5f;
  int32_t* ga = g.put_i32(std::vector<int32_t>(size_t(T)));
  int32_t* ca = c.put_i32(std::vector<int32_t>(size_t(T)));
  gpu_be_->argmax(g.m(g.put(lg), T, V), ga);
  cpu_be_->argmax(c.m(c.put(lg), T, V), ca);
  std::vector<int32_t> got = g.get_i32(ga, size_t(T)), want = c.get_i32(ca, size_t(T));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 3);
  EXPECT_EQ(got[1], 1000);
  EXPECT_EQ(got[2], 0);

  // A vocabulary of many chunks: ties across chunks, the maximum in the last partial chunk.
  const int64_t BV = 151937;
  auto big = rnd(size_t(2 * BV));
  big[size_t(90000)] = big[size_t(5000)] = 12.0f;
  big[size_t(BV + BV - 1)] = 12.0f;
  int32_t* gb = g.put_i32(std::vector<int32_t>(2));
  int32_t* cb = c.put_i32(std::vector<int32_t>(2));
  gpu_be_->argmax(g.m(g.put(big), 2, BV), gb);
  cpu_be_->argmax(c.m(c.put(big), 2, BV), cb);
  EXPECT_EQ(g.get_i32(gb, 2), c.get_i32(cb, 2));
  EXPECT_EQ(g.get_i32(gb, 2), (std::vector<int32_t>{5000, int32_t(BV - 1)}));

  // Rows without a pick give -1 (a NaN or +inf anywhere, or nothing finite), also when the bad value
  // is in another chunk than the maximum; -inf beside finite values is only a low logit.
  const int64_t NR = 6;
  auto odd = rnd(size_t(NR * BV));
  odd[size_t(0 * BV + 17)] = NAN;
  odd[size_t(1 * BV + BV - 2)] = INFINITY;
  std::fill(odd.begin() + 2 * BV, odd.begin() + 3 * BV, -INFINITY);
  odd[size_t(3 * BV + 100)] = 50.0f;  // the maximum in the first chunk, a NaN in the last
  odd[size_t(3 * BV + 150000)] = NAN;
  std::fill(odd.begin() + 4 * BV, odd.begin() + 5 * BV, -INFINITY);
  odd[size_t(4 * BV + 77777)] = -3.0f;  // the one finite logit
  for (int64_t j = 0; j < BV; j += 2) odd[size_t(5 * BV + j)] = -INFINITY;
  odd[size_t(5 * BV + 3)] = 40.0f;
  odd = round_dt(odd);
  int32_t* gn = g.put_i32(std::vector<int32_t>(size_t(NR)));
  int32_t* cn = c.put_i32(std::vector<int32_t>(size_t(NR)));
  gpu_be_->argmax(g.m(g.put(odd), NR, BV), gn);
  cpu_be_->argmax(c.m(c.put(odd), NR, BV), cn);
  EXPECT_EQ(g.get_i32(gn, size_t(NR)), c.get_i32(cn, size_t(NR)));
  EXPECT_EQ(g.get_i32(gn, size_t(NR)), (std::vector<int32_t>{-1, -1, -1, -1, 77777, 3}));
}

TEST_P(CudaOps, RopeCacheWrite) {
  struct Case {
    int q_heads, kv_heads, head_dim, rot_dim;
    bool qk_norm, heads_first;
  };
  for (Case cs : {Case{4, 2, 32, 32, false, true}, Case{8, 2, 24, 16, true, false}, Case{6, 3, 128, 128, true, true},
                  Case{4, 2, 256, 192, true, true},
                  Case{2, 1, 64, 32, false, false}}) {
    const CacheSpec cspec{3, cs.kv_heads, 40, cs.head_dim, cs.heads_first};
    const std::vector<Chunk> chunks = {{2, 5, 3}, {0, 0, 7}, {1, 39, 1}};
    const Meta meta = make_meta(chunks);
    const int64_t T = int64_t(meta.row.size()), W = int64_t(cs.q_heads + 2 * cs.kv_heads) * cs.head_dim;
    auto qkv = rnd(size_t(T * W)), kc = rnd(cspec.elems()), vc = rnd(cspec.elems());
    auto qn = rnd(size_t(cs.head_dim)), kn = rnd(size_t(cs.head_dim));
    std::vector<float> inv(size_t(cs.rot_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(10000.0f, -2.0f * float(i) / float(cs.rot_dim));
    Side& g = *gpu_;
    Side& c = *cpu_;
    RopeWriteParams gp, cp;
    void *gq = g.put(qkv), *cq = c.put(qkv), *gk = g.put(kc), *gv = g.put(vc), *ck = c.put(kc), *cv = c.put(vc);
    for (auto [p, s, q, k, v] : {std::tuple{&gp, &g, gq, gk, gv}, std::tuple{&cp, &c, cq, ck, cv}}) {
      p->qkv = s->m(q, T, W);
      p->q_norm = cs.qk_norm ? s->put(qn) : nullptr;
      p->k_norm = cs.qk_norm ? s->put(kn) : nullptr;
      p->norm_dtype = s->dt;
      p->norm_eps = 1e-6f;
      p->inv_freq = s->put_f32(inv);
      p->rot_dim = cs.rot_dim;
      p->attn_scale = 1.1f;
      p->q_heads = cs.q_heads;
      p->kv_heads = cs.kv_heads;
      p->head_dim = cs.head_dim;
      p->meta = put_meta(*s, meta);
      p->cache = cspec.view(k, v, s->dt);
    }
    gpu_be_->rope_cache_write(gp);
    cpu_be_->rope_cache_write(cp);
    const std::string what = "rope hd=" + std::to_string(cs.head_dim) + (cs.heads_first ? " heads_first" : " flattened");
    expect_close(g.get(gq, size_t(T * W)), c.get(cq, size_t(T * W)), tol(), what + " qkv");
    expect_close(g.get(gk, cspec.elems()), round_dt(c.get(ck, cspec.elems())), tol(), what + " k cache");
    expect_close(g.get(gv, cspec.elems()), c.get(cv, cspec.elems()), {0, 0}, what + " v cache");
  }
}

TEST_P(CudaOps, Attention) {
  // Which rows decode where: kMixed, rows at different write indices (a prefill chunk, single decode
  // tokens, one at the last slot, a chunk in the middle); kLong, the same plus a decode token at slot
  // 4096 (kv_len 4097: many chunks and slices, a partial last chunk); kShort, only short rows under a
  // bound (the capacity) far above them, as in a decode graph early in generation. Every case adds a
  // token whose kv_len is 0 (all keys masked: zeros).
  enum Rows { kMixed, kLong, kShort };
  struct Case {
    int q_heads, kv_heads, head_dim, window, capacity;
    bool heads_first, bound_is_capacity;
    Rows rows;
    float q_scale;  // > 1 sharpens the softmax so the long rows' outputs are far from zero
  };
  for (Case cs : {Case{4, 2, 16, 0, 50, true, false, kMixed, 1.f}, Case{8, 2, 64, 0, 700, false, true, kMixed, 1.f},
                  Case{6, 3, 40, 5, 90, true, true, kMixed, 1.f}, Case{32, 8, 128, 0, 384, true, true, kMixed, 1.f},
                  Case{4, 4, 128, 33, 1000, false, false, kMixed, 1.f},
                  Case{12, 1, 256, 0, 130, true, true, kMixed, 1.f},
                  Case{8, 2, 128, 0, 5000, true, false, kLong, 2.f}, Case{8, 2, 128, 700, 5000, false, true, kLong, 2.f},
                  Case{8, 2, 128, 0, 5000, true, true, kShort, 2.f}, Case{4, 1, 96, 700, 5000, false, true, kLong, 2.f},
                  Case{8, 2, 64, 0, 5000, false, true, kShort, 2.f}}) {
    const CacheSpec cspec{5, cs.kv_heads, cs.capacity, cs.head_dim, cs.heads_first};
    std::vector<Chunk> chunks = {{1, 0, 9}, {3, cs.capacity - 1, 1}, {0, 17, 5}, {2, 40 % cs.capacity, 1}};
    if (cs.rows == kLong) chunks.push_back({4, 4096, 1});
    if (cs.rows == kShort) chunks = {{1, 0, 9}, {0, 17, 5}, {2, 40, 1}, {4, 100, 1}};
    Meta meta = make_meta(chunks);
    meta.row.push_back(2);
    meta.slot.push_back(3);
    meta.pos.push_back(3);
    meta.kv_len.push_back(0);
    const int64_t T = int64_t(meta.row.size()), QD = int64_t(cs.q_heads) * cs.head_dim;
    // rows = tokens: decode-like, so the split-KV kernels take every call here.
    AttnRun r = attention_both(cspec, meta, cs.q_heads, cs.window, cs.bound_is_capacity, int(T), cs.q_scale);
    const std::string what = "attention q=" + std::to_string(cs.q_heads) + " kv=" + std::to_string(cs.kv_heads) +
                             " hd=" + std::to_string(cs.head_dim) + " window=" + std::to_string(cs.window) +
                             " capacity=" + std::to_string(cs.capacity) + " bound=" + std::to_string(r.gpu.max_kv_len);
    expect_close(r.got, r.want, tol(), what);
    for (int64_t i = 0; i < QD; ++i) ASSERT_EQ(r.got[size_t((T - 1) * QD + i)], 0.0f) << what << ": all-masked row";
    // The slice counters must be back at zero: a second call gives the same bits.
    gpu_be_->attention(r.gpu);
    EXPECT_EQ(gpu_->get(r.gpu.out.data, size_t(T * QD)), r.got) << what << ": second call";
  }
}

// Many decode rows of unequal lengths: more (token, head group) items than the device runs at once, so
// the kernel hands them out longest row first (attention.cu). Checked against the CPU, and the
// remapping checked to change no bit: the same tokens in the reverse order (another ranking of ties
// and of blocks) give each token the same output bits.
TEST_P(CudaOps, AttentionManyRowsLongestFirst) {
  for (int window : {0, 150}) {
    const int64_t R = 200, q_heads = 16, kv_heads = 4, hd = 64, cap = 400;
    const CacheSpec cspec{R, kv_heads, cap, hd, true};
    Meta fwd;
    for (int64_t r = 0; r < R; ++r) {
      const int32_t len = r == 7 ? 0 : int32_t(1 + (r * 37) % (cap - 1));  // row 7: nothing visible
      fwd.row.push_back(int32_t(r));
      fwd.slot.push_back(std::max(len - 1, 0));
      fwd.pos.push_back(std::max(len - 1, 0));
      fwd.kv_len.push_back(len);
    }
    Meta rev = fwd;
    for (auto* v : {&rev.row, &rev.slot, &rev.pos, &rev.kv_len}) std::reverse(v->begin(), v->end());
    const int64_t QD = q_heads * hd;
    const std::vector<float> q = rnd(size_t(R * QD), 2.0f), kc = rnd(cspec.elems()), vc = rnd(cspec.elems());
    std::vector<float> q_rev(q.size());
    for (int64_t t = 0; t < R; ++t) std::copy_n(q.begin() + (R - 1 - t) * QD, QD, q_rev.begin() + t * QD);
    auto run = [&](Side& s, Backend& be, const Meta& m, const std::vector<float>& qv) {
      AttentionParams p;
      void* o = s.put(std::vector<float>(size_t(R * QD), 7.0f));
      p.q = s.m(s.put(qv), R, QD);
      p.out = s.m(o, R, QD);
      p.q_heads = int(q_heads);
      p.kv_heads = int(kv_heads);
      p.head_dim = int(hd);
      p.window = window;
      p.scale = 1.0f / std::sqrt(float(hd));
      p.max_kv_len = int(cap);  // as a captured decode graph bounds it
      p.rows = int(R);
      p.meta = put_meta(s, m);
      p.cache = cspec.view(s.put(kc), s.put(vc), s.dt);
      be.attention(p);
      return s.get(o, size_t(R * QD));
    };
    const std::vector<float> got = run(*gpu_, *gpu_be_, fwd, q), got_rev = run(*gpu_, *gpu_be_, rev, q_rev);
    const std::vector<float> want = run(*cpu_, *cpu_be_, fwd, q);
    const std::string what = "200 decode rows, window " + std::to_string(window);
    expect_close(got, want, tol(), what);
    for (int64_t i = 0; i < QD; ++i) ASSERT_EQ(got[size_t(7 * QD + i)], 0.0f) << what << ": all-masked row";
    for (int64_t t = 0; t < R; ++t)
      for (int64_t i = 0; i < QD; ++i)
        ASSERT_EQ(got[size_t(t * QD + i)], got_rev[size_t((R - 1 - t) * QD + i)])
            << what << ": token " << t << " differs when the rows come in the reverse order";
  }
}

TEST_P(CudaOps, GraphReplayMatchesDirect) {
  const int64_t T = 2, H = 300;
  auto x = rnd(size_t(T * H)), w = rnd(size_t(H));
  Side& g = *gpu_;
  void *gx = g.put(x), *gw = g.put(w), *go = g.put(std::vector<float>(size_t(T * H)));
  gpu_be_->add_rmsnorm(g.m(gx, T, H), nullptr, gw, dt_, 1e-6f, g.m(go, T, H));
  auto direct = g.get(go, size_t(T * H));
  gpu_be_->fill_zero(go, size_t(T * H) * dtype_size(dt_));
  auto graph = gpu_be_->capture([&] { gpu_be_->add_rmsnorm(g.m(gx, T, H), nullptr, gw, dt_, 1e-6f, g.m(go, T, H)); });
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(g.get(go, size_t(T * H)), std::vector<float>(size_t(T * H), 0.0f)) << "capture must not execute";
  graph->replay();
  EXPECT_EQ(g.get(go, size_t(T * H)), direct);
}

TEST_P(CudaOps, MemoryAndBandwidth) {
  const size_t before = gpu_be_->peak_memory_bytes();
  { Buffer b(*gpu_be_, size_t(1) << 26); }
  EXPECT_GE(gpu_be_->peak_memory_bytes(), before);
  EXPECT_GE(gpu_be_->peak_memory_bytes(), size_t(1) << 26);
  EXPECT_THROW(Buffer(*gpu_be_, size_t(1) << 50), Error);
}

// Calls with many query tokens per row take the tensor-core prefill kernel in 16-bit (the rows hint
// says how many rows the tokens come from): several rows share 64-token tiles, one row windowed,
// rows at other write indices, and a token with nothing visible (zeros); head_dim 64, 128 and 256
// (Qwen3.5's, whose kernel keeps Q in shared memory and takes 32-key tiles).
TEST_P(CudaOps, AttentionPrefill) {
  struct Case {
    int q_heads, kv_heads, head_dim, window, capacity;
    bool heads_first, bound_is_capacity;
  };
  for (Case cs : {Case{32, 8, 128, 0, 300, true, false}, Case{8, 2, 64, 20, 256, false, true},
                  Case{4, 4, 128, 0, 200, false, true}, Case{16, 2, 64, 0, 1100, true, false},
                  Case{16, 4, 256, 0, 300, true, false}, Case{8, 2, 256, 20, 1100, false, true}}) {
    const CacheSpec cspec{4, cs.kv_heads, cs.capacity, cs.head_dim, cs.heads_first};
    std::vector<Chunk> chunks = {{1, 0, 100}, {0, 37, 70}, {2, 5, 30}};
    if (cs.capacity > 1000) chunks.push_back({3, 900, 150});
    Meta meta = make_meta(chunks);
    if (cs.capacity <= 1000) {  // one more row: a token that sees nothing
      meta.row.push_back(3);
      meta.slot.push_back(3);
      meta.pos.push_back(3);
      meta.kv_len.push_back(0);
    }
    const int64_t T = int64_t(meta.row.size()), QD = int64_t(cs.q_heads) * cs.head_dim;
    AttnRun r = attention_both(cspec, meta, cs.q_heads, cs.window, cs.bound_is_capacity, 4);
    const std::string what = "prefill attention q=" + std::to_string(cs.q_heads) + " kv=" + std::to_string(cs.kv_heads) +
                             " hd=" + std::to_string(cs.head_dim) + " window=" + std::to_string(cs.window);
    expect_close(r.got, r.want, tol(), what);
    if (cs.capacity <= 1000)
      for (int64_t i = 0; i < QD; ++i) ASSERT_EQ(r.got[size_t((T - 1) * QD + i)], 0.0f) << what << ": all-masked row";
  }
}

// Settings the sample tests cycle through: the argmax with and without the penalty, each filter alone
// and in combinations, top-p so small only the top survives, and top-k of the vocabulary less one (-1).
const std::vector<SampleParams> kSampleSettings = {
    {0.0f, 0, 1.0f, 0.0f, 1.0f, 0},   {0.0f, 0, 1.0f, 0.0f, 1.3f, 0},     {1.0f, 0, 1.0f, 0.0f, 1.0f, 0},
    {0.7f, 20, 1.0f, 0.0f, 1.0f, 0},  {1.0f, 1, 1.0f, 0.0f, 1.0f, 0},     {0.9f, 0, 0.9f, 0.0f, 1.0f, 0},
    {0.6f, 50, 0.5f, 0.0f, 1.0f, 0},  {1.0f, 0, 1.0f, 0.05f, 1.0f, 0},    {1.0f, 0, 0.95f, 0.2f, 1.0f, 0},
    {0.8f, 0, 1.0f, 0.0f, 1.3f, 0},   {2.0f, 0, 1.0f, 0.0f, 1.0f, 0},     {1.5f, 1000, 0.99f, 0.01f, 1.1f, 0},
    {0.3f, 3, 0.3f, 0.5f, 0.8f, 0},   {5.0f, 0, 0.999f, 0.0f, 1.0f, 0},   {1.0f, 0, 1e-6f, 0.0f, 1.0f, 0},
    {1.0f, -1, 1.0f, 0.0f, 1.0f, 0},
};

std::string describe(const SampleParams& p) {
  return "temperature " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
         std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p) + " penalty " +
         std::to_string(p.repetition_penalty) + " frequency " + std::to_string(p.frequency_penalty) + " presence " +
         std::to_string(p.presence_penalty);
}

// The sample op picks exactly the CPU reference's tokens (identical, not close): a Qwen-sized and a
// tiny vocabulary, rows of every kind (spread, wide, heavy ties, all equal, -inf entries, two tied
// dominant tokens far above the rest, a NaN or +inf, all -inf), every setting, rows reaching their state through an
// indirection, three calls so the draw counters and seen marks carry over.
TEST_P(CudaOps, SampleMatchesCpu) {
  for (int64_t V : {int64_t(151936), int64_t(37)}) {
    const int64_t R = V > 1000 ? 18 : 64;
    std::vector<float> lg = rnd(size_t(R * V), 2.0f);
    for (int64_t r = 0; r < R; ++r) {
      float* l = lg.data() + r * V;
      switch (r % 8) {
        case 1: for (int64_t j = 0; j < V; ++j) l[j] *= 4.0f; break;
        case 2: for (int64_t j = 0; j < V; ++j) l[j] = std::round(l[j] * 2.0f) / 2.0f; break;
        case 3: std::fill(l, l + V, 1.25f); break;
        case 4: for (int64_t j = 0; j < V; j += 3) l[j] = -INFINITY; break;
        case 5:
          for (int64_t j = 0; j < V; ++j) l[j] -= 30.0f;
          l[V / 2] = l[V / 3] = 10.0f;
          break;
        case 6: l[(r * 13) % V] = r % 16 == 6 ? NAN : INFINITY; break;  // no pick: -1, seen untouched
        case 7: std::fill(l, l + V, -INFINITY); break;                  // nothing finite: -1
        default: break;
      }
    }
    lg = round_dt(lg);
    std::vector<SampleParams> params(static_cast<size_t>(R));
    std::vector<uint32_t> step(static_cast<size_t>(R));
    std::vector<int32_t> state_of(static_cast<size_t>(R));
    std::vector<uint8_t> seen(static_cast<size_t>(R * V));
    for (int64_t r = 0; r < R; ++r) {
      SampleParams& p = params[size_t(r)];
      p = kSampleSettings[size_t(r) % kSampleSettings.size()];
      p.seed = 1000 + uint64_t(r);
      if (p.top_k < 0 || p.top_k >= V) p.top_k = int32_t(V - 1);
      // Every third row also takes the additive penalties (over the counts below), one of them negative.
      if (r % 3 == 1) {
        p.frequency_penalty = 0.4f;
        p.presence_penalty = r % 2 ? 1.1f : -0.7f;
      }
      step[size_t(r)] = uint32_t(rng_());
      state_of[size_t(r)] = int32_t((r * 7 + 3) % R);  // a permutation: 7 is prime to R
    }
    for (uint8_t& x : seen) x = rng_() % 20 == 0;
    std::vector<int32_t> counts(static_cast<size_t>(R * V));
    for (int32_t& x : counts) x = rng_() % 25 == 0 ? int32_t(1 + rng_() % 4) : 0;
    Side& g = *gpu_;
    auto put_raw = [&](const void* p, size_t n) {
      g.keep.emplace_back(*gpu_be_, n);
      gpu_be_->upload(g.keep.back().get(), p, n);
      return g.keep.back().get();
    };
    SampleState gs{g.put_i32(state_of), static_cast<const SampleParams*>(put_raw(params.data(), params.size() * sizeof(SampleParams))),
                   static_cast<uint32_t*>(put_raw(step.data(), step.size() * 4)),
                   static_cast<uint8_t*>(put_raw(seen.data(), seen.size())), V, g.put_i32(counts), V};
    SampleState cs{state_of.data(), params.data(), step.data(), seen.data(), V, counts.data(), V};
    const Mat glg = g.m(g.put(lg), R, V), clg = mat(lg.data(), DType::F32, R, V);
    int32_t* gout = g.put_i32(std::vector<int32_t>(size_t(R)));
    std::vector<int32_t> cout(static_cast<size_t>(R));
    for (int call = 0; call < 3; ++call) {
      gpu_be_->sample(glg, gs, gout);
      cpu_be_->sample(clg, cs, cout.data());
      const std::vector<int32_t> got = g.get_i32(gout, size_t(R));
      for (int64_t r = 0; r < R; ++r)
        EXPECT_EQ(got[size_t(r)], cout[size_t(r)])
            << "vocab " << V << " call " << call << " row " << r << " (kind " << r % 8 << ", "
            << describe(params[size_t(state_of[size_t(r)])]) << ")";
    }
    // One row per call, as batch-1 decode launches it (on Hopper the row's blocks are a whole cluster).
    for (int64_t r = 0; r < R; ++r) {
      SampleState g1 = gs, c1 = cs;
      g1.row += r;
      c1.row += r;
      Mat g_one = glg, c_one = clg;
      g_one.data = static_cast<uint8_t*>(glg.data) + size_t(r * glg.ld) * dtype_size(glg.dtype);
      c_one.data = static_cast<float*>(clg.data) + r * clg.ld;
      g_one.rows = c_one.rows = 1;
      gpu_be_->sample(g_one, g1, gout + r);
      cpu_be_->sample(c_one, c1, cout.data() + r);
      EXPECT_EQ(g.get_i32(gout + r, 1)[0], cout[size_t(r)])
          << "vocab " << V << " row " << r << " alone (kind " << r % 8 << ", "
          << describe(params[size_t(state_of[size_t(r)])]) << ")";
    }
    std::vector<uint32_t> gstep(step.size());
    std::vector<uint8_t> gseen(seen.size());
    gpu_be_->download(gstep.data(), gs.step, gstep.size() * 4);
    gpu_be_->download(gseen.data(), gs.seen, gseen.size());
    EXPECT_EQ(gstep, step) << "vocab " << V << ": draw counters";
    EXPECT_TRUE(gseen == seen) << "vocab " << V << ": seen marks differ";
    EXPECT_TRUE(g.get_i32(gs.counts, counts.size()) == counts) << "vocab " << V << ": counts differ";
  }
}

// The sample op's other launch shapes pick the CPU reference's tokens too: a vocabulary whose slices do
// not fit the blocks' key caches (on an H200, beyond ~770k tokens even over a cluster of 16), so every pass
// recomputes its keys from the logits; and a batch whose clusters the op widens so that its slices fit
// the cache (on an H200, 72 rows of 152k: 2 blocks per row by the SM count, 4 for the cache).
TEST_P(CudaOps, SampleLaunchShapesMatchCpu) {
  for (const auto& [V, R] : {std::pair<int64_t, int64_t>{1000003, 4}, std::pair<int64_t, int64_t>{151936, 72}}) {
    std::vector<float> lg = rnd(size_t(R * V), 2.0f);
    for (int64_t r = 0; r < R; ++r) {
      float* l = lg.data() + r * V;
      if (r % 4 == 1)
        for (int64_t j = 0; j < V; ++j) l[j] = std::round(l[j] * 2.0f) / 2.0f;  // heavy ties
      if (r % 4 == 2)
        for (int64_t j = 0; j < V; j += 3) l[j] = -INFINITY;
    }
    lg = round_dt(lg);
    std::vector<SampleParams> params(static_cast<size_t>(R));
    std::vector<uint32_t> step(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      SampleParams& p = params[size_t(r)];
      p = kSampleSettings[size_t(r * 5) % kSampleSettings.size()];
      p.seed = 7 + uint64_t(r);
      if (p.top_k < 0 || p.top_k >= V) p.top_k = int32_t(V - 1);
      if (r % 3 == 1) {
        p.frequency_penalty = 0.4f;
        p.presence_penalty = 1.1f;
      }
      step[size_t(r)] = uint32_t(rng_());
    }
    std::vector<uint8_t> seen(static_cast<size_t>(R * V));
    for (uint8_t& x : seen) x = rng_() % 20 == 0;
    std::vector<int32_t> counts(static_cast<size_t>(R * V));
    for (int32_t& x : counts) x = rng_() % 25 == 0 ? int32_t(1 + rng_() % 4) : 0;
    Side& g = *gpu_;
    auto put_raw = [&](const void* p, size_t n) {
      g.keep.emplace_back(*gpu_be_, n);
      gpu_be_->upload(g.keep.back().get(), p, n);
      return g.keep.back().get();
    };
    SampleState gs{nullptr, static_cast<const SampleParams*>(put_raw(params.data(), params.size() * sizeof(SampleParams))),
                   static_cast<uint32_t*>(put_raw(step.data(), step.size() * 4)),
                   static_cast<uint8_t*>(put_raw(seen.data(), seen.size())), V, g.put_i32(counts), V};
    SampleState cs{nullptr, params.data(), step.data(), seen.data(), V, counts.data(), V};
    const Mat glg = g.m(g.put(lg), R, V), clg = mat(lg.data(), DType::F32, R, V);
    int32_t* gout = g.put_i32(std::vector<int32_t>(size_t(R)));
    std::vector<int32_t> cout(static_cast<size_t>(R));
    for (int call = 0; call < 2; ++call) {
      gpu_be_->sample(glg, gs, gout);
      cpu_be_->sample(clg, cs, cout.data());
      const std::vector<int32_t> got = g.get_i32(gout, size_t(R));
      for (int64_t r = 0; r < R; ++r)
        EXPECT_EQ(got[size_t(r)], cout[size_t(r)])
            << "vocab " << V << " rows " << R << " call " << call << " row " << r << " (" << describe(params[size_t(r)])
            << ")";
    }
    EXPECT_TRUE(g.get_i32(gs.counts, counts.size()) == counts) << "vocab " << V << ": counts differ";
  }
}

// The logprobs op against the CPU reference (backend/logprobs.h): the top-N ids exactly (ties to the
// lower id), the values within a float sum's rounding. Rows of random logits, heavy ties, -inf entries
// and one huge logit; chosen ids anywhere, including kNoToken.
TEST_P(CudaOps, LogprobsMatchCpu) {
  for (int64_t V : {int64_t(151936), int64_t(37), int64_t(12)}) {
    const int64_t R = 6;
    std::vector<float> lg = rnd(size_t(R * V), 3.0f);
    for (int64_t r = 0; r < R; ++r) {
      float* l = lg.data() + r * V;
      if (r == 1)
        for (int64_t j = 0; j < V; ++j) l[j] = float(j % 4);  // ties everywhere
      if (r == 2)
        for (int64_t j = 0; j < V; j += 2) l[j] = -INFINITY;
      if (r == 3) l[V / 2] = 60.0f;
    }
    lg = round_dt(lg);
    std::vector<int32_t> chosen(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) chosen[size_t(r)] = int32_t(rng_() % uint64_t(V));
    chosen[5] = sampling::kNoToken;
    for (int top_n : {0, 5, 20}) {
      Side& g = *gpu_;
      const Mat glg = g.m(g.put(lg), R, V);
      float* gc = g.put_f32(std::vector<float>(size_t(R), 7.0f));
      int32_t* gi = g.put_i32(std::vector<int32_t>(size_t(R * top_n) + 1, 7));
      float* gv = g.put_f32(std::vector<float>(size_t(R * top_n) + 1, 7.0f));
      gpu_be_->logprobs(glg, g.put_i32(chosen), top_n, gc, gi, gv);
      std::vector<float> cc(static_cast<size_t>(R)), cv(static_cast<size_t>(R * top_n));
      std::vector<int32_t> ci(static_cast<size_t>(R * top_n));
      cpu_be_->logprobs(mat(lg.data(), DType::F32, R, V), chosen.data(), top_n, cc.data(), ci.data(), cv.data());
      const std::vector<float> got_c = g.get(gc, size_t(R), DType::F32);
      const std::vector<int32_t> got_i = g.get_i32(gi, size_t(R * top_n));
      const std::vector<float> got_v = g.get(gv, size_t(R * top_n), DType::F32);
      const std::string what = "vocab " + std::to_string(V) + " top_n " + std::to_string(top_n);
      // Non-finite values (a -inf token, no token) must be the same; finite ones close.
      auto close = [](float got, float want) {
        if (!std::isfinite(want)) return std::isnan(want) ? std::isnan(got) : got == want;
        return std::fabs(got - want) <= 1e-4f + 1e-5f * std::fabs(want);
      };
      EXPECT_TRUE(std::isnan(got_c[5])) << what;
      for (int64_t r = 0; r < R; ++r)
        EXPECT_TRUE(close(got_c[size_t(r)], cc[size_t(r)])) << what << " row " << r << ": " << got_c[size_t(r)] << " vs " << cc[size_t(r)];
      EXPECT_EQ(got_i, ci) << what;
      for (size_t k = 0; k < cv.size(); ++k)
        EXPECT_TRUE(close(got_v[k], cv[k])) << what << " entry " << k << ": " << got_v[k] << " vs " << cv[k];
    }
  }
}

// A captured sample op replayed gives the tokens of the same calls run directly: the state it reads
// and advances lives in buffers, so each replay draws anew.
TEST_P(CudaOps, SampleGraphReplayMatchesDirect) {
  const int64_t V = 5003, R = 4;
  const int calls = 6;
  const std::vector<float> lg = rnd(size_t(R * V), 3.0f);
  const std::vector<SampleParams> params = {{0.9f, 0, 0.9f, 0.0f, 1.2f, 1},
                                            {1.0f, 40, 1.0f, 0.02f, 1.0f, 2},
                                            {0.0f, 0, 1.0f, 0.0f, 1.3f, 3},
                                            {1.5f, 0, 1.0f, 0.0f, 1.0f, 4}};
  const std::vector<uint32_t> step0 = {0, 10, 20, 30};
  const std::vector<uint8_t> seen0(size_t(R * V), 0);
  Side& g = *gpu_;
  Buffer bp(*gpu_be_, params.size() * sizeof(SampleParams)), bs(*gpu_be_, step0.size() * 4), bn(*gpu_be_, seen0.size());
  gpu_be_->upload(bp.get(), params.data(), bp.size());
  SampleState st{nullptr, bp.as<SampleParams>(), bs.as<uint32_t>(), bn.as<uint8_t>(), V};
  const Mat m = g.m(g.put(lg), R, V);
  int32_t* out = g.put_i32(std::vector<int32_t>(size_t(R)));
  auto reset = [&] {
    gpu_be_->upload(bs.get(), step0.data(), bs.size());
    gpu_be_->upload(bn.get(), seen0.data(), bn.size());
  };
  auto state = [&] {
    std::vector<uint32_t> s(step0.size());
    gpu_be_->download(s.data(), bs.get(), bs.size());
    return s;
  };
  reset();
  std::vector<std::vector<int32_t>> direct, replayed;
  for (int k = 0; k < calls; ++k) {
    gpu_be_->sample(m, st, out);
    direct.push_back(g.get_i32(out, size_t(R)));
  }
  std::vector<uint8_t> seen_direct(seen0.size()), seen_graph(seen0.size());
  gpu_be_->download(seen_direct.data(), bn.get(), bn.size());
  reset();
  auto graph = gpu_be_->capture([&] { gpu_be_->sample(m, st, out); });
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(state(), step0) << "capture must not execute";
  for (int k = 0; k < calls; ++k) {
    graph->replay();
    replayed.push_back(g.get_i32(out, size_t(R)));
  }
  gpu_be_->download(seen_graph.data(), bn.get(), bn.size());
  EXPECT_EQ(replayed, direct);
  EXPECT_TRUE(seen_graph == seen_direct);
  EXPECT_EQ(state(), (std::vector<uint32_t>{calls, 10 + calls, 20 + calls, 30 + calls}));
  std::set<int32_t> row0;
  for (const auto& d : direct) row0.insert(d[0]);
  EXPECT_GT(row0.size(), 1u) << "row 0 samples: successive draws should differ";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

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
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
