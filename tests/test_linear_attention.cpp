// The CPU reference of the linear-attention (Gated DeltaNet) ops against a plain scalar restatement of
// their definitions (in double), and the state contract: any split of a row's tokens over calls gives the
// same bits, rows at different slots share a call, rows not in a call are untouched byte for byte, a
// token at slot 0 ignores whatever the state buffer held, and the thread count changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace ingot {
namespace {

// A small layer with n_v = 2 n_k and d_k != d_v.
struct Cfg {
  int HK = 2, HV = 4, DK = 8, DV = 12, K = 4, B = 4;
  float eps = 1e-6f;
  int C() const { return 2 * HK * DK + HV * DV; }
};

// One row's whole sequence of inputs.
struct Seq {
  std::vector<float> x, b, a, z;  // [L, C], [L, HV], [L, HV], [L, HV * DV]
  int L = 0;
};

struct Weights {
  std::vector<float> conv, a_log, dt_bias, norm;  // [C, K], [HV], [HV], [DV]
};

std::vector<float> normal(std::mt19937& rng, size_t n, float mean, float sd) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

Weights make_weights(const Cfg& c, std::mt19937& rng) {
  Weights w;
  w.conv = normal(rng, size_t(c.C() * c.K), 0.0f, 0.5f);
  w.a_log = normal(rng, size_t(c.HV), -0.5f, 1.0f);
  w.dt_bias = normal(rng, size_t(c.HV), 0.0f, 1.0f);
  w.norm = normal(rng, size_t(c.DV), 1.0f, 0.2f);
  return w;
}

Seq make_seq(const Cfg& c, int L, std::mt19937& rng) {
  Seq s;
  s.L = L;
  s.x = normal(rng, size_t(L * c.C()), 0.0f, 1.0f);
  s.b = normal(rng, size_t(L * c.HV), 0.0f, 1.5f);
  s.a = normal(rng, size_t(L * c.HV), 0.0f, 1.5f);
  s.z = normal(rng, size_t(L * c.HV * c.DV), 0.0f, 1.0f);
  return s;
}

// The definitions restated per row over the whole sequence from a zero state, in double.
struct RefOut {
  std::vector<double> conv, core, out;  // [L, C], [L, HV*DV], [L, HV*DV]
  std::vector<double> conv_state, state;  // [C, K-1], [HV, DK, DV]
};

RefOut reference(const Cfg& c, const Weights& w, const Seq& s) {
  const int C = c.C(), L = s.L;
  RefOut r;
  r.conv.assign(size_t(L * C), 0.0);
  for (int t = 0; t < L; ++t)
    for (int ch = 0; ch < C; ++ch) {
      double acc = 0;
      for (int j = 0; j < c.K; ++j) {
        const int tt = t - (c.K - 1) + j;
        if (tt >= 0) acc += double(w.conv[size_t(ch * c.K + j)]) * s.x[size_t(tt * C + ch)];
      }
      r.conv[size_t(t * C + ch)] = acc / (1.0 + std::exp(-acc));
    }
  r.conv_state.assign(size_t(C * (c.K - 1)), 0.0);
  for (int ch = 0; ch < C; ++ch)
    for (int i = 0; i < c.K - 1; ++i) {
      const int tt = L - (c.K - 1) + i;
      r.conv_state[size_t(ch * (c.K - 1) + i)] = tt >= 0 ? s.x[size_t(tt * C + ch)] : 0.0;
    }
  const int VD = c.HV * c.DV;
  r.core.assign(size_t(L * VD), 0.0);
  r.out.assign(size_t(L * VD), 0.0);
  r.state.assign(size_t(c.HV * c.DK * c.DV), 0.0);
  for (int h = 0; h < c.HV; ++h) {
    const int kh = h / (c.HV / c.HK);
    double* S = r.state.data() + size_t(h * c.DK * c.DV);
    for (int t = 0; t < L; ++t) {
      const double* row = r.conv.data() + size_t(t * C);
      const double* q = row + kh * c.DK;
      const double* k = row + c.HK * c.DK + kh * c.DK;
      const double* v = row + 2 * c.HK * c.DK + h * c.DV;
      double nq = 0, nk = 0;
      for (int i = 0; i < c.DK; ++i) nq += q[i] * q[i], nk += k[i] * k[i];
      std::vector<double> qh(size_t(c.DK)), kh_(size_t(c.DK));
      for (int i = 0; i < c.DK; ++i) {
        qh[size_t(i)] = q[i] / std::sqrt(nq + 1e-6) / std::sqrt(double(c.DK));
        kh_[size_t(i)] = k[i] / std::sqrt(nk + 1e-6);
      }
      const double beta = 1.0 / (1.0 + std::exp(-double(s.b[size_t(t * c.HV + h)])));
      const double xa = double(s.a[size_t(t * c.HV + h)]) + w.dt_bias[size_t(h)];
      const double sp = xa > 20 ? xa : std::log1p(std::exp(xa));
      const double g = -std::exp(double(w.a_log[size_t(h)])) * sp;
      for (int i = 0; i < c.DK * c.DV; ++i) S[i] *= std::exp(g);
      for (int j = 0; j < c.DV; ++j) {
        double kv = 0;
        for (int i = 0; i < c.DK; ++i) kv += S[i * c.DV + j] * kh_[size_t(i)];
        const double d = beta * (v[j] - kv);
        for (int i = 0; i < c.DK; ++i) S[i * c.DV + j] += kh_[size_t(i)] * d;
      }
      for (int j = 0; j < c.DV; ++j) {
        double o = 0;
        for (int i = 0; i < c.DK; ++i) o += S[i * c.DV + j] * qh[size_t(i)];
        r.core[size_t(t * VD + h * c.DV + j)] = o;
      }
    }
  }
  for (int t = 0; t < L; ++t)
    for (int h = 0; h < c.HV; ++h) {
      const double* o = r.core.data() + size_t(t * VD + h * c.DV);
      const float* z = s.z.data() + size_t(t * VD + h * c.DV);
      double ss = 0;
      for (int j = 0; j < c.DV; ++j) ss += o[j] * o[j];
      const double inv = 1.0 / std::sqrt(ss / c.DV + c.eps);
      for (int j = 0; j < c.DV; ++j)
        r.out[size_t(t * VD + h * c.DV + j)] = w.norm[size_t(j)] * o[j] * inv * (z[j] / (1.0 + std::exp(-double(z[j]))));
    }
  return r;
}

// One call: tokens [start, start + len) of a row.
struct Piece {
  int row, start, len;
};

// The layer's state and per-row outputs on the CPU backend; `run` packs a call's pieces, runs the three
// ops and scatters the outputs back per row.
struct Layer {
  Cfg c;
  const Weights& w;
  std::vector<float> conv_state, state;
  std::vector<std::vector<float>> conv_out, core, out;  // per row, [L, ...]
  Layer(const Cfg& cfg, const Weights& wt, int max_len) : c(cfg), w(wt) {
    conv_state.assign(size_t(c.B * c.C() * (c.K - 1)), 0.0f);
    state.assign(size_t(c.B * c.HV * c.DK * c.DV), 0.0f);
    conv_out.assign(size_t(c.B), std::vector<float>(size_t(max_len * c.C()), 0.0f));
    core.assign(size_t(c.B), std::vector<float>(size_t(max_len * c.HV * c.DV), 0.0f));
    out = core;
  }
  void run(Backend& be, const std::vector<const Seq*>& seqs, const std::vector<Piece>& pieces, bool in_place) {
    const int C = c.C(), VD = c.HV * c.DV;
    std::vector<float> x, b, a, z;
    std::vector<int32_t> row, slot;
    for (const Piece& p : pieces) {
      const Seq& s = *seqs[size_t(p.row)];
      for (int i = p.start; i < p.start + p.len; ++i) {
        x.insert(x.end(), s.x.begin() + i * C, s.x.begin() + (i + 1) * C);
        b.insert(b.end(), s.b.begin() + i * c.HV, s.b.begin() + (i + 1) * c.HV);
        a.insert(a.end(), s.a.begin() + i * c.HV, s.a.begin() + (i + 1) * c.HV);
        z.insert(z.end(), s.z.begin() + i * VD, s.z.begin() + (i + 1) * VD);
        row.push_back(p.row);
        slot.push_back(i);
      }
    }
    const int64_t T = int64_t(row.size());
    std::vector<float> y(in_place ? 0 : x.size()), o(size_t(T * VD)), n(size_t(T * VD));
    TokenMeta meta{row.data(), slot.data(), slot.data(), nullptr};
    CausalConv1dParams cp;
    cp.x = mat(x.data(), DType::F32, T, C);
    cp.out = in_place ? cp.x : mat(y.data(), DType::F32, T, C);
    cp.weight = w.conv.data();
    cp.kernel = c.K;
    cp.state = conv_state.data();
    cp.meta = meta;
    be.causal_conv1d(cp);
    float* conv = in_place ? x.data() : y.data();
    GatedDeltaRuleParams gp;
    gp.q = {conv, DType::F32, T, c.HK * c.DK, C};
    gp.k = {conv + c.HK * c.DK, DType::F32, T, c.HK * c.DK, C};
    gp.v = {conv + 2 * c.HK * c.DK, DType::F32, T, VD, C};
    gp.b = mat(b.data(), DType::F32, T, c.HV);
    gp.a = mat(a.data(), DType::F32, T, c.HV);
    gp.a_log = w.a_log.data();
    gp.dt_bias = w.dt_bias.data();
    gp.out = mat(o.data(), DType::F32, T, VD);
    gp.k_heads = c.HK, gp.v_heads = c.HV, gp.d_k = c.DK, gp.d_v = c.DV;
    gp.state = state.data();
    gp.meta = meta;
    be.gated_delta_rule(gp);
    GatedRmsNormParams np;
    np.x = gp.out;
    np.z = mat(z.data(), DType::F32, T, VD);
    np.out = mat(n.data(), DType::F32, T, VD);
    np.weight = w.norm.data();
    np.heads = c.HV, np.dim = c.DV, np.eps = c.eps;
    be.gated_rmsnorm(np);
    for (int64_t t = 0; t < T; ++t) {
      const size_t r = size_t(row[size_t(t)]), s = size_t(slot[size_t(t)]);
      std::copy_n(conv + t * C, C, conv_out[r].begin() + long(s) * C);
      std::copy_n(o.begin() + t * VD, VD, core[r].begin() + long(s) * VD);
      std::copy_n(n.begin() + t * VD, VD, out[r].begin() + long(s) * VD);
    }
  }
  // The row's slice of each state.
  std::vector<float> conv_state_of(int r) const {
    const size_t n = size_t(c.C() * (c.K - 1));
    return {conv_state.begin() + long(r * n), conv_state.begin() + long((r + 1) * n)};
  }
  std::vector<float> state_of(int r) const {
    const size_t n = size_t(c.HV * c.DK * c.DV);
    return {state.begin() + long(r * n), state.begin() + long((r + 1) * n)};
  }
};

void expect_near_ref(const std::vector<float>& got, const std::vector<double>& want, size_t n, const std::string& what) {
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    worst = std::max(worst, d);
    if (!(d <= 2e-5 + 2e-5 * std::fabs(want[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": max |diff| " << worst;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class LinearAttention : public ::testing::Test {
 protected:
  Cfg c;
  std::mt19937 rng{7};
  Weights w = make_weights(c, rng);
  std::vector<Seq> seqs;
  std::vector<const Seq*> ptrs() const {
    std::vector<const Seq*> p;
    for (const Seq& s : seqs) p.push_back(&s);
    return p;
  }
  void SetUp() override {
    for (int r = 0; r < c.B; ++r) seqs.push_back(make_seq(c, 40 + 3 * r, rng));
  }
};

TEST_F(LinearAttention, MatchesScalarDefinition) {
  auto be = make_cpu_backend(2);
  for (bool in_place : {true, false}) {
    Layer layer(c, w, 64);
    // Garbage in the state buffers: slot 0 must ignore it.
    std::fill(layer.conv_state.begin(), layer.conv_state.end(), 1e3f);
    std::fill(layer.state.begin(), layer.state.end(), -7.0f);
    std::vector<Piece> all;
    for (int r = 0; r < c.B; ++r) all.push_back({r, 0, seqs[size_t(r)].L});
    layer.run(*be, ptrs(), all, in_place);
    for (int r = 0; r < c.B; ++r) {
      const RefOut ref = reference(c, w, seqs[size_t(r)]);
      const std::string tag = "row " + std::to_string(r) + (in_place ? " in place" : " out of place");
      const int L = seqs[size_t(r)].L;
      expect_near_ref(layer.conv_out[size_t(r)], ref.conv, size_t(L * c.C()), tag + " conv");
      expect_near_ref(layer.core[size_t(r)], ref.core, size_t(L * c.HV * c.DV), tag + " delta rule");
      expect_near_ref(layer.out[size_t(r)], ref.out, size_t(L * c.HV * c.DV), tag + " gated norm");
      expect_near_ref(layer.conv_state_of(r), ref.conv_state, ref.conv_state.size(), tag + " conv state");
      expect_near_ref(layer.state_of(r), ref.state, ref.state.size(), tag + " recurrent state");
    }
  }
}

TEST_F(LinearAttention, ShortSequencesKeepZeroHistory) {
  // Fewer tokens than the kernel: the conv state holds zeros for the slots before 0.
  auto be = make_cpu_backend(1);
  Layer layer(c, w, 64);
  std::fill(layer.conv_state.begin(), layer.conv_state.end(), 5.0f);
  std::vector<Seq> one{make_seq(c, 2, rng)};
  std::vector<const Seq*> p{&one[0]};
  layer.run(*be, p, {{0, 0, 1}}, true);
  layer.run(*be, p, {{0, 1, 1}}, false);
  const RefOut ref = reference(c, w, one[0]);
  expect_near_ref(layer.conv_out[0], ref.conv, size_t(2 * c.C()), "conv");
  expect_near_ref(layer.conv_state_of(0), ref.conv_state, ref.conv_state.size(), "conv state");
  expect_near_ref(layer.out[0], ref.out, size_t(2 * c.HV * c.DV), "out");
}

TEST_F(LinearAttention, ChunkSplitsAreBitwiseOneCall) {
  auto be = make_cpu_backend(2);
  const int L = seqs[0].L;
  Layer whole(c, w, 64);
  whole.run(*be, ptrs(), {{0, 0, L}}, true);
  // Token by token, then random splits (several seeds), alternating in place and out of place.
  std::vector<std::vector<int>> splits;
  splits.emplace_back(size_t(L), 1);
  std::mt19937 srng(3);
  for (int s = 0; s < 4; ++s) {
    std::vector<int> parts;
    for (int left = L; left > 0;) {
      const int n = std::min(left, int(srng() % 9) + 1);
      parts.push_back(n);
      left -= n;
    }
    splits.push_back(parts);
  }
  for (size_t si = 0; si < splits.size(); ++si) {
    Layer part(c, w, 64);
    int start = 0, i = 0;
    for (int n : splits[si]) {
      part.run(*be, ptrs(), {{0, start, n}}, (i++ % 2) == 0);
      start += n;
    }
    const std::string tag = "split " + std::to_string(si);
    EXPECT_TRUE(same_bits(part.conv_out[0], whole.conv_out[0])) << tag;
    EXPECT_TRUE(same_bits(part.core[0], whole.core[0])) << tag;
    EXPECT_TRUE(same_bits(part.out[0], whole.out[0])) << tag;
    EXPECT_TRUE(same_bits(part.conv_state_of(0), whole.conv_state_of(0))) << tag;
    EXPECT_TRUE(same_bits(part.state_of(0), whole.state_of(0))) << tag;
  }
}

TEST_F(LinearAttention, RowsAtDifferentSlotsShareACallAndOthersAreUntouched) {
  // Rows 0, 2 and 3 advance at different paces, sometimes together in one call (in varying order);
  // row 1 is never in a call: its state bytes stay exactly as they were. Each row must equal the row
  // run alone in one call.
  auto be = make_cpu_backend(3);
  Layer mixed(c, w, 64);
  for (size_t i = 0; i < mixed.conv_state.size(); ++i) mixed.conv_state[i] = float(i % 97) * 0.25f;
  for (size_t i = 0; i < mixed.state.size(); ++i) mixed.state[i] = float(i % 89) * -0.5f;
  const std::vector<float> conv1 = mixed.conv_state_of(1), state1 = mixed.state_of(1);
  const std::vector<std::vector<Piece>> calls = {
      {{0, 0, 5}, {2, 0, 1}, {3, 0, 9}},
      {{2, 1, 7}, {0, 5, 1}},
      {{3, 9, 1}, {0, 6, 2}, {2, 8, 1}},
      {{0, 8, 30}, {3, 10, 1}},
      {{2, 9, 1}, {3, 11, 20}},
  };
  for (size_t i = 0; i < calls.size(); ++i) mixed.run(*be, ptrs(), calls[i], i % 2 == 1);
  const int lens[4] = {38, 0, 10, 31};
  for (int r : {0, 2, 3}) {
    Layer alone(c, w, 64);
    alone.run(*be, ptrs(), {{r, 0, lens[r]}}, true);
    const std::string tag = "row " + std::to_string(r);
    const size_t nc = size_t(lens[r] * c.C()), nv = size_t(lens[r] * c.HV * c.DV);
    EXPECT_EQ(0, std::memcmp(mixed.conv_out[size_t(r)].data(), alone.conv_out[size_t(r)].data(), nc * 4)) << tag;
    EXPECT_EQ(0, std::memcmp(mixed.out[size_t(r)].data(), alone.out[size_t(r)].data(), nv * 4)) << tag;
    EXPECT_TRUE(same_bits(mixed.conv_state_of(r), alone.conv_state_of(r))) << tag;
    EXPECT_TRUE(same_bits(mixed.state_of(r), alone.state_of(r))) << tag;
  }
  EXPECT_TRUE(same_bits(mixed.conv_state_of(1), conv1));
  EXPECT_TRUE(same_bits(mixed.state_of(1), state1));
}

TEST_F(LinearAttention, SlotZeroResetsTheRow) {
  auto be = make_cpu_backend(2);
  Layer fresh(c, w, 64), reused(c, w, 64);
  fresh.run(*be, ptrs(), {{1, 0, 12}}, true);
  reused.run(*be, ptrs(), {{1, 0, 20}}, true);  // a previous conversation in the row
  reused.run(*be, ptrs(), {{1, 0, 12}}, false);  // restarts at slot 0 without clearing
  EXPECT_TRUE(same_bits(reused.conv_state_of(1), fresh.conv_state_of(1)));
  EXPECT_TRUE(same_bits(reused.state_of(1), fresh.state_of(1)));
  EXPECT_EQ(0, std::memcmp(reused.out[1].data(), fresh.out[1].data(), size_t(12 * c.HV * c.DV) * 4));
}

TEST_F(LinearAttention, ThreadCountChangesNothing) {
  std::vector<Piece> call;
  for (int r = 0; r < c.B; ++r) call.push_back({r, 0, seqs[size_t(r)].L});
  auto one = make_cpu_backend(1), four = make_cpu_backend(4);
  Layer l1(c, w, 64), l4(c, w, 64);
  l1.run(*one, ptrs(), call, true);
  l4.run(*four, ptrs(), call, true);
  EXPECT_TRUE(same_bits(l1.state, l4.state));
  EXPECT_TRUE(same_bits(l1.conv_state, l4.conv_state));
  for (int r = 0; r < c.B; ++r) EXPECT_TRUE(same_bits(l1.out[size_t(r)], l4.out[size_t(r)]));
}

TEST_F(LinearAttention, RejectsBrokenContracts) {
  auto be = make_cpu_backend(1);
  Layer layer(c, w, 64);
  // Row 0's tokens split by row 2's: not consecutive.
  EXPECT_THROW(layer.run(*be, ptrs(), {{0, 0, 2}, {2, 0, 1}, {0, 2, 1}}, true), Error);
}

}  // namespace
}  // namespace ingot
