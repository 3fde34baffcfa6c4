// Op-level conformance of the CUDA backend against the CPU reference backend: every op on random shapes (odd
// sizes, GQA, rows at different write indices, sliding windows, the all-masked row, both cache layouts), f32
// with tight tolerances and f16/bf16 with tolerances of their rounding. Inputs are rounded to the tested
// dtype first, so both backends see the same values. Skips without a GPU. INT4 products, the sample and
// logprobs ops, and f32 activations over 16-bit weights have programs of their own (test_cuda_int4_ops,
// test_cuda_sample_ops, test_cuda_f32_activations) over the same fixture (cuda_ops_fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
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
  // full and tail steps and a last block of rows past N), 2..8 tokens (the tensor-core kernel in 16
  // bits: its splits from one to sixteen warps a tile, K not a multiple of a step, N not of 16), odd K
  // (cuBLASLt fallback) and more tokens (cuBLASLt).
  for (Shape s : {Shape{1, 37, 64, false}, Shape{1, 129, 1024, true}, Shape{1, 70, 1096, false},
                  Shape{1, 33, 2048, true}, Shape{1, 131, 3072, false}, Shape{1, 65, 4104, true},
                  Shape{3, 129, 1096, true}, Shape{8, 70, 2048, false}, Shape{2, 37, 64, false},
                  Shape{4, 4099, 72, true}, Shape{7, 300, 4104, false}, Shape{8, 1000, 1024, true},
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

// 2..8 tokens (the tensor-core product): a token's outputs do not depend on which tokens share the
// call or where it sits among them, bit for bit (each output's sum has one order, whatever T is).
TEST_P(CudaOps, FewTokenProductIsTheSameForEveryTokenWhateverTheCall) {
  if (dt_ == DType::F32) GTEST_SKIP() << "the tensor-core product takes 16-bit activations";
  for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {1000, 1096}, {24576, 256}}) {
    auto x = rnd(size_t(8 * K)), w = rnd(size_t(N * K), 0.05f), b = rnd(size_t(N));
    Side& g = *gpu_;
    void *gx = g.put(x), *gw = g.put(w), *gb = g.put(b);
    void* all = g.put(std::vector<float>(size_t(8 * N)));
    gpu_be_->linear(g.m(gx, 8, K), g.m(gw, N, K), gb, g.m(all, 8, N));
    const auto ref = g.get(all, size_t(8 * N));
    // Tokens 3..5 as a call of three; tokens 5 and 0 as a call of two (token 5 first).
    void* x35 = g.put(std::vector<float>(x.begin() + 3 * K, x.begin() + 6 * K));
    void* y35 = g.put(std::vector<float>(size_t(3 * N)));
    gpu_be_->linear(g.m(x35, 3, K), g.m(gw, N, K), gb, g.m(y35, 3, N));
    EXPECT_EQ(g.get(y35, size_t(3 * N)), std::vector<float>(ref.begin() + 3 * N, ref.begin() + 6 * N))
        << "tokens 3..5 of 8 against a call of those three, N=" << N << " K=" << K;
    std::vector<float> x5(x.begin() + 5 * K, x.begin() + 6 * K);
    x5.insert(x5.end(), x.begin(), x.begin() + K);
    void* y50 = g.put(std::vector<float>(size_t(2 * N)));
    gpu_be_->linear(g.m(g.put(x5), 2, K), g.m(gw, N, K), gb, g.m(y50, 2, N));
    const auto got = g.get(y50, size_t(2 * N));
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + N), std::vector<float>(ref.begin() + 5 * N, ref.begin() + 6 * N))
        << "token 5 of 8 against the first of two, N=" << N << " K=" << K;
    EXPECT_EQ(std::vector<float>(got.begin() + N, got.end()), std::vector<float>(ref.begin(), ref.begin() + N))
        << "token 0 of 8 against the second of two, N=" << N << " K=" << K;
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

  // The argmax split over ranks (tensor parallelism): the rows cut into 2 and 4 parts (the last one
  // short; big's tie 5000 / 90000 across the cut at 2), each part's ArgmaxPart, merged on the device,
  // give the argmax of the whole rows.
  void *godd = g.put(odd), *gbig = g.put(big);
  const size_t es = dtype_size(dt_);
  for (int world : {2, 4})
    for (auto [src, rows, want] : {std::tuple{godd, NR, g.get_i32(gn, size_t(NR))}, std::tuple{gbig, int64_t(2), g.get_i32(gb, 2)}}) {
      const int64_t per = (BV + world - 1) / world;
      auto* parts = reinterpret_cast<ArgmaxPart*>(g.put_i32(std::vector<int32_t>(size_t(2 * world * rows))));
      for (int w = 0; w < world; ++w)
        gpu_be_->argmax_part(Mat{static_cast<uint8_t*>(src) + size_t(w * per) * es, dt_, rows, std::min(per, BV - w * per), BV},
                             w * per, parts + w * rows);
      int32_t* merged = g.put_i32(std::vector<int32_t>(size_t(rows), 77));
      gpu_be_->argmax_merge(parts, rows, world, merged);
      EXPECT_EQ(g.get_i32(merged, size_t(rows)), want) << "world " << world;
    }
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

// Many decode rows: more (token, head group) items than the device runs at once, so the kernel hands
// them out longest row first by the ranking the Model uploads (TokenMeta::order; with every row of one
// length the ranking is -1: launch order), and 16-bit calls take the tensor-core decode kernel
// (attention_decode_mma.cu; groups of 4 and 16 query heads, head_dim 64 and 128). Checked against the
// CPU, and the remapping checked to change no bit: without a ranking (launch order), and the same
// tokens in the reverse order (another ranking of ties and of blocks), each token gets the same bits.
TEST_P(CudaOps, AttentionManyRowsLongestFirst) {
  struct Shape {
    int64_t R, q_heads, kv_heads, hd, cap;
  };
  for (const Shape& sh : {Shape{300, 16, 4, 64, 400}, Shape{120, 32, 8, 128, 160}, Shape{250, 32, 2, 128, 96},
                          Shape{200, 16, 8, 128, 96}})
    // Rows of unequal lengths (ranked), and of one length (launch order).
    for (const auto& [window, equal] : {std::pair{0, false}, std::pair{50, false}, std::pair{0, true}, std::pair{50, true}}) {
      const int64_t R = sh.R, q_heads = sh.q_heads, kv_heads = sh.kv_heads, hd = sh.hd, cap = sh.cap;
      const CacheSpec cspec{R, kv_heads, cap, hd, true};
      Meta fwd;
      for (int64_t r = 0; r < R; ++r) {
        // Unequal: row 7 sees nothing.
        const int32_t len = equal ? int32_t(cap * 4 / 5) : r == 7 ? 0 : int32_t(1 + (r * 37) % (cap - 1));
        fwd.row.push_back(int32_t(r));
        fwd.slot.push_back(std::max(len - 1, 0));
        fwd.pos.push_back(std::max(len - 1, 0));
        fwd.kv_len.push_back(len);
      }
      Meta plain = fwd, rev = fwd;
      for (auto* v : {&rev.row, &rev.slot, &rev.pos, &rev.kv_len}) std::reverse(v->begin(), v->end());
      fwd.order = longest_first_order(fwd.kv_len);
      rev.order = longest_first_order(rev.kv_len);
      ASSERT_EQ(fwd.order[0] < 0, equal);
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
      const std::vector<float> got_plain = run(*gpu_, *gpu_be_, plain, q);
      const std::vector<float> want = run(*cpu_, *cpu_be_, fwd, q);
      const std::string what = std::to_string(R) + " decode rows of " + (equal ? "one length" : "unequal lengths") +
                               ", " + std::to_string(q_heads) + "/" + std::to_string(kv_heads) + " heads of " +
                               std::to_string(hd) + ", window " + std::to_string(window);
      expect_close(got, want, tol(), what);
      ASSERT_EQ(got, got_plain) << what << ": the ranking changed bits";
      if (!equal)
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

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ingot
#else
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
