// Conformance of the CUDA linear-attention ops (causal conv1d, gated delta rule, gated RMSNorm) against
// the CPU reference: f32/f16/bf16, rows at different slots in one call (a fresh row at slot 0 over a
// garbage state, rows continuing from a state, a row with fewer tokens than the kernel), in place and
// out of place, the state carried over several calls, Qwen3.5-9B's head shapes (d_k = d_v = 128,
// 16/32 heads) and odd ones, long runs (the chunked kernel) beside short ones, and a row outside the call
// left byte-identical. Inputs are rounded to the
// tested dtype first so both backends see the same values; states are fp32 on both. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "cuda_test_helpers.h"

#ifdef INGOT_WITH_CUDA
namespace ingot {
namespace {

using test::expect_close;
using test::Side;
using test::Tol;
using test::tol_for;

// States are fp32 on both backends; they differ only by the order of fp32 sums (and the GPU's
// contracted multiply-adds), compounded over the tokens of a call.
constexpr Tol kStateTol{5e-5, 2e-4};

// Tokens of one row in a call: slots [start, start + len).
struct Piece {
  int row, start, len;
};

struct Meta {
  std::vector<int32_t> row, slot;
};

Meta make_meta(const std::vector<Piece>& pieces) {
  Meta m;
  for (const Piece& p : pieces)
    for (int i = 0; i < p.len; ++i) {
      m.row.push_back(p.row);
      m.slot.push_back(p.start + i);
    }
  return m;
}

struct Shape {
  int HK, HV, DK, DV, K, B;
  int C() const { return 2 * HK * DK + HV * DV; }
};

class CudaLinearAttention : public test::CudaVsCpu {
 protected:
  std::vector<float> rnd(size_t n, float mean = 0.0f, float sd = 1.0f) {
    std::normal_distribution<float> d(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    std::vector<uint8_t> raw(n * dtype_size(dt_));
    convert_from_f32(dt_, v.data(), raw.data(), n);
    convert_to_f32(dt_, raw.data(), v.data(), n);
    return v;
  }
  std::string tag(const Shape& s, const std::string& what) const {
    return std::string(dtype_name(dt_)) + " hk" + std::to_string(s.HK) + " hv" + std::to_string(s.HV) + " dk" +
           std::to_string(s.DK) + " dv" + std::to_string(s.DV) + ": " + what;
  }

  // The three ops over a sequence of calls on both backends, comparing every output and both states
  // after each call. Each op is compared alone: the CPU's delta rule reads the GPU's conv output and its
  // norm the GPU's delta-rule output (values of the tested dtype), so 16-bit roundings do not compound.
  // Row `untouched` is never in a call: its GPU state bytes must not change. With pass_rows the delta
  // rule and the conv are told the call's row count (as the model does; they pick kernels by it), else
  // 0 (unknown).
  void run_layer(const Shape& s, const std::vector<std::vector<Piece>>& calls, int untouched, bool pass_rows = false) {
    const int C = s.C(), VD = s.HV * s.DV, QK = s.HK * s.DK;
    const auto conv_w = rnd(size_t(C * s.K), 0.0f, 0.5f), a_log = rnd(size_t(s.HV), -0.5f, 1.0f),
               dt_bias = rnd(size_t(s.HV)), norm_w = rnd(size_t(s.DV), 1.0f, 0.2f);
    // Start from random states (a row whose first call is at slot 0 must ignore them).
    const auto conv_state = rnd(size_t(s.B * C * (s.K - 1))), state = rnd(size_t(s.B * s.HV * s.DK * s.DV), 0.0f, 0.3f);
    Side& g = *gpu_;
    Side& c = *cpu_;
    float* g_cs = g.put_f32(conv_state);
    float* g_st = g.put_f32(state);
    float* c_cs = c.put_f32(conv_state);
    float* c_st = c.put_f32(state);
    const size_t cs_row = size_t(C * (s.K - 1)), st_row = size_t(s.HV * s.DK * s.DV);
    for (size_t ci = 0; ci < calls.size(); ++ci) {
      const Meta meta = make_meta(calls[ci]);
      const int64_t T = int64_t(meta.row.size());
      const auto x = rnd(size_t(T * C)), z = rnd(size_t(T * VD));
      // b and a interleaved in one [T, 2 HV] buffer, read through strided views.
      const auto ba = rnd(size_t(T * 2 * s.HV), 0.0f, 1.5f);
      const bool in_place = ci % 2 == 0;
      const std::string call = "call " + std::to_string(ci) + (in_place ? " (in place)" : " (out of place)");
      const TokenMeta gm{g.put_i32(meta.row), g.put_i32(meta.slot), nullptr, nullptr};
      const TokenMeta cm{c.put_i32(meta.row), c.put_i32(meta.slot), nullptr, nullptr};

      // conv1d
      CausalConv1dParams gc, cc;
      for (auto [p, sd, tm, st] : {std::tuple{&gc, &g, gm, g_cs}, std::tuple{&cc, &c, cm, c_cs}}) {
        p->x = sd->m(sd->put(x), T, C);
        p->out = in_place ? p->x : sd->m(sd->put(std::vector<float>(size_t(T * C), 7.0f)), T, C);
        p->weight = sd->put(conv_w);
        p->weight_dtype = sd->dt;
        p->kernel = s.K;
        p->state = st;
        p->meta = tm;
        // Told the row count, out-of-place prefill calls take the token-parallel conv kernel.
        p->rows = pass_rows ? int(calls[ci].size()) : 0;
        sd->be.causal_conv1d(*p);
      }
      const auto conv_g = g.get(gc.out.data, size_t(T * C));
      expect_close(conv_g, c.get(cc.out.data, size_t(T * C)), tol_for(dt_), tag(s, call + " conv"));

      // gated delta rule, q/k/v strided views into the conv output
      GatedDeltaRuleParams gp, cp;
      void* c_conv = c.put(conv_g);
      for (auto [p, sd, tm, st, conv] : {std::tuple{&gp, &g, gm, g_st, gc.out.data}, std::tuple{&cp, &c, cm, c_st, c_conv}}) {
        auto* base = static_cast<uint8_t*>(conv);
        const size_t e = dtype_size(sd->dt);
        p->q = sd->m(base, T, QK, C);
        p->k = sd->m(base + size_t(QK) * e, T, QK, C);
        p->v = sd->m(base + size_t(2 * QK) * e, T, VD, C);
        auto* bap = static_cast<uint8_t*>(sd->put(ba));
        p->b = sd->m(bap, T, s.HV, 2 * s.HV);
        p->a = sd->m(bap + size_t(s.HV) * e, T, s.HV, 2 * s.HV);
        p->a_log = sd->put(a_log, DType::F32);
        p->a_log_dtype = DType::F32;
        p->dt_bias = sd->put(dt_bias);
        p->dt_bias_dtype = sd->dt;
        p->out = sd->m(sd->put(std::vector<float>(size_t(T * VD), 7.0f)), T, VD);
        p->k_heads = s.HK, p->v_heads = s.HV, p->d_k = s.DK, p->d_v = s.DV;
        p->state = st;
        p->meta = tm;
        p->rows = pass_rows ? int(calls[ci].size()) : 0;
        sd->be.gated_delta_rule(*p);
      }
      const auto core_g = g.get(gp.out.data, size_t(T * VD));
      expect_close(core_g, c.get(cp.out.data, size_t(T * VD)), tol_for(dt_), tag(s, call + " delta rule"));

      // gated RMSNorm
      GatedRmsNormParams gn, cn;
      void* c_core = c.put(core_g);
      for (auto [p, sd, xin] : {std::tuple{&gn, &g, gp.out.data}, std::tuple{&cn, &c, c_core}}) {
        p->x = sd->m(xin, T, VD);
        p->z = sd->m(sd->put(z), T, VD);
        p->out = in_place ? p->x : sd->m(sd->put(std::vector<float>(size_t(T * VD), 7.0f)), T, VD);
        p->weight = sd->put(norm_w);
        p->weight_dtype = sd->dt;
        p->heads = s.HV, p->dim = s.DV, p->eps = 1e-6f;
        sd->be.gated_rmsnorm(*p);
      }
      expect_close(g.get(gn.out.data, size_t(T * VD)), c.get(cn.out.data, size_t(T * VD)), tol_for(dt_),
                   tag(s, call + " gated rmsnorm"));

      const auto gcs = g.get(g_cs, conv_state.size(), DType::F32), ccs = c.get(c_cs, conv_state.size(), DType::F32);
      const auto gst = g.get(g_st, state.size(), DType::F32), cst = c.get(c_st, state.size(), DType::F32);
      expect_close(gcs, ccs, {0.0, 0.0}, tag(s, call + " conv state"));
      expect_close(gst, cst, kStateTol, tag(s, call + " recurrent state"));
      if (untouched >= 0) {
        EXPECT_EQ(0, std::memcmp(gcs.data() + untouched * cs_row, conv_state.data() + untouched * cs_row, cs_row * 4))
            << tag(s, call + " conv state of the untouched row");
        EXPECT_EQ(0, std::memcmp(gst.data() + untouched * st_row, state.data() + untouched * st_row, st_row * 4))
            << tag(s, call + " recurrent state of the untouched row");
      }
    }
  }

  std::mt19937 rng_{11};
};

// Rows at different slots: row 2 fresh at slot 0 over a garbage state, row 0 continuing from its state,
// row 3 a single token at slot 1 (history before slot 0 is zero); row 1 never in a call. Then decode
// steps of all three in one call, then a prefill chunk beside a decode token.
std::vector<std::vector<Piece>> mixed_calls() {
  return {
      {{2, 0, 9}, {0, 5, 7}, {3, 1, 1}},
      {{0, 12, 1}, {3, 2, 1}, {2, 9, 1}},
      {{3, 3, 1}, {0, 13, 40}, {2, 10, 1}},
      {{2, 11, 1}},
  };
}

// For the token-parallel conv (out-of-place calls, told the row count: calls 1 and 3): multi-token
// runs fresh at slot 0 over a garbage state, continuing from a state, and shorter than the kernel's
// window (whose inputs come partly from the state), beside single tokens; row 4 never in a call.
std::vector<std::vector<Piece>> token_calls() {
  return {
      {{1, 0, 2}},
      {{2, 0, 9}, {0, 5, 7}, {3, 1, 1}, {1, 2, 2}},
      {{0, 12, 1}, {2, 9, 1}},
      {{0, 13, 40}, {1, 4, 1}, {2, 10, 3}, {3, 2, 2}},
  };
}

TEST_P(CudaLinearAttention, TokenParallelConv) {
  run_layer({2, 4, 16, 32, 4, 5}, token_calls(), 4, true);
  run_layer({3, 6, 48, 40, 3, 5}, token_calls(), 4, true);  // kernel 3, odd sizes
  run_layer({2, 4, 16, 32, 2, 5}, token_calls(), 4, true);  // kernel 2: a one-input window
  run_layer({2, 4, 16, 32, 8, 5}, token_calls(), 4, true);  // kernel 8: the widest
}

TEST_P(CudaLinearAttention, SmallShapes) {
  run_layer({2, 4, 16, 32, 4, 4}, mixed_calls(), 1);  // the qwen3_5_wrapped fixture's heads
  run_layer({1, 2, 32, 16, 4, 4}, mixed_calls(), 1);  // the qwen3_5_pattern fixture's heads
  run_layer({3, 6, 48, 40, 3, 4}, mixed_calls(), 1);  // odd sizes: partial column tiles, kernel 3
}

TEST_P(CudaLinearAttention, Qwen35NineBHeads) {
  run_layer({16, 32, 128, 128, 4, 4}, mixed_calls(), 1);
}

TEST_P(CudaLinearAttention, LongRunAndLargeDk) {
  // A 300-token prefill then decode, and d_k 256 (8 warps per block).
  run_layer({2, 4, 256, 64, 4, 2}, {{{0, 0, 300}}, {{0, 300, 1}}, {{1, 0, 2}, {0, 301, 1}}}, -1);
}

// Long runs take the chunked kernel (runs of 32 tokens or more unless INGOT_GDN_CHUNK_MIN says
// otherwise): several rows in one call, at slot 0 over a garbage state and continuing from a state, run
// lengths that are and are not multiples of the 64-token chunk, beside decode tokens and short runs
// (the sequential kernel in the same call), then more long runs from the carried states.
TEST_P(CudaLinearAttention, LongChunkedRuns) {
  const std::vector<std::vector<Piece>> calls = {
      {{2, 0, 300}, {0, 7, 1}, {1, 40, 200}, {3, 0, 5}, {4, 0, 64}},
      {{2, 300, 130}, {3, 5, 33}, {1, 240, 1}, {4, 64, 128}, {0, 8, 31}},
  };
  run_layer({16, 32, 128, 128, 4, 6}, calls, 5);        // Qwen3.5-9B's heads
  run_layer({2, 4, 96, 80, 4, 6}, calls, 5, true);      // d_k != d_v: padded k rows, a partial column tile
  run_layer({2, 2, 64, 128, 4, 6}, calls, 5, true);     // d_k < d_v, one value head per key head
}

// One row per call, told so: the long run is the chunked kernel's alone (the sequential one is not
// launched), then decode from the state it left.
TEST_P(CudaLinearAttention, SingleRowPrefill) {
  run_layer({16, 32, 128, 128, 4, 2}, {{{0, 0, 200}}, {{0, 200, 77}}, {{0, 277, 1}}}, 1, true);
}

// Timing, not a check (run with --gtest_also_run_disabled_tests): the delta rule on Qwen3.5-9B's heads
// over 48 layers' states in turn (more than L2), captured in a graph, as decode at batch 1, 8 and 64
// (GB/s of state read + written), and single-row prefill calls of 32 to 4,096 tokens (the chunked kernel
// unless INGOT_GDN_CHUNK_MIN=0).
TEST_P(CudaLinearAttention, DISABLED_Timing) {
  const int HK = 16, HV = 32, DK = 128, DV = 128, L = 48, QK = HK * DK, C = 2 * QK + HV * DV;
  Side& g = *gpu_;
  for (int B : {1, 8, 64, -32, -64, -128, -4096}) {
    const int rows = B > 0 ? B : 1, T = B > 0 ? B : -B;
    const size_t st_elems = size_t(rows) * HV * DK * DV;
    std::vector<Buffer> states;
    for (int l = 0; l < L; ++l) {
      states.emplace_back(*gpu_be_, st_elems * 4);
      gpu_be_->fill_zero(states.back().get(), st_elems * 4);
    }
    Meta meta;
    for (int t = 0; t < T; ++t) {
      meta.row.push_back(B > 0 ? t : 0);
      meta.slot.push_back(B > 0 ? 5 : t + 1);
    }
    const TokenMeta tm{g.put_i32(meta.row), g.put_i32(meta.slot), nullptr, nullptr};
    auto* conv = static_cast<uint8_t*>(g.put(rnd(size_t(T) * C)));
    const size_t e = dtype_size(dt_);
    GatedDeltaRuleParams p;
    p.q = g.m(conv, T, QK, C);
    p.k = g.m(conv + QK * e, T, QK, C);
    p.v = g.m(conv + 2 * QK * e, T, HV * DV, C);
    auto* ba = static_cast<uint8_t*>(g.put(rnd(size_t(T) * 2 * HV)));
    p.b = g.m(ba, T, HV, 2 * HV);
    p.a = g.m(ba + HV * e, T, HV, 2 * HV);
    p.a_log = g.put(rnd(HV), DType::F32);
    p.dt_bias = g.put(rnd(HV), DType::F32);
    p.out = g.m(g.put(std::vector<float>(size_t(T) * HV * DV)), T, HV * DV);
    p.k_heads = HK, p.v_heads = HV, p.d_k = DK, p.d_v = DV;
    p.meta = tm;
    p.rows = rows;
    const int layers = B > 0 ? L : 4;
    auto body = [&] {
      for (int l = 0; l < layers; ++l) {
        p.state = states[size_t(l)].as<float>();
        gpu_be_->gated_delta_rule(p);
      }
    };
    body();
    gpu_be_->synchronize();
    auto graph = gpu_be_->capture(body);
    const int reps = B > 0 ? 20 : 2;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) graph ? graph->replay() : body();
    gpu_be_->synchronize();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                      double(reps * layers);
    if (B > 0)
      std::printf("%s decode batch %d: %.2f us per layer call, %.0f GB/s of state (read + write)\n", dtype_name(dt_).data(),
                  B, us, 2.0 * double(st_elems) * 4 / (us * 1e3));
    else
      std::printf("%s prefill %d tokens, one row: %.1f us per layer call, %.0f tokens/s per layer\n",
                  dtype_name(dt_).data(), T, us, double(T) / (us * 1e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLinearAttention, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ingot
#else
TEST(CudaLinearAttention, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
