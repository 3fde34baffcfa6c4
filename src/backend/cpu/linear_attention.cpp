// CPU reference of the linear-attention (Gated DeltaNet) ops of backend.h: causal conv1d + SiLU, the
// gated delta rule and the gated RMSNorm. fp32 activations, fp32 state, fp32 accumulation in a fixed
// order. Work is split over OpenMP threads by (row segment, channel) or (row segment, value head), and
// each output element and state row is computed by one thread in token order, so results depend
// neither on the thread count nor on which other rows are in the call, and a row's tokens give the same
// bits whether they come in one call or several (the state is the whole carry, kept in fp32).
#include "backend/cpu/linear_attention.h"

#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ingot::cpu {
namespace {

// A run of consecutive tokens of one row: [start, start + len), slots first_slot, first_slot + 1, ...
struct Segment {
  int64_t start, len;
  int32_t row, first_slot;
};

// Splits the call's tokens into per-row runs and checks the contract (a row's tokens consecutive, in
// slot order, each row once per call).
std::vector<Segment> segments(const TokenMeta& m, int64_t T, const char* op) {
  std::vector<Segment> segs;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t r = m.row[t], s = m.slot[t];
    if (r < 0 || s < 0)
      throw Error(std::string("cpu backend: ") + op + ": negative row or slot at token " + std::to_string(t));
    if (!segs.empty() && segs.back().row == r) {
      if (s != segs.back().first_slot + segs.back().len)
        throw Error(std::string("cpu backend: ") + op + ": row " + std::to_string(r) +
                    "'s tokens are not in consecutive slots");
      ++segs.back().len;
    } else {
      for (const Segment& g : segs)
        if (g.row == r)
          throw Error(std::string("cpu backend: ") + op + ": row " + std::to_string(r) +
                      "'s tokens are not consecutive in the call");
      segs.push_back({t, 1, r, s});
    }
  }
  return segs;
}

std::vector<float> widen(const void* p, DType t, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  convert_to_f32(t, p, v.data(), size_t(n));
  return v;
}

inline float* frow(const Mat& m, int64_t r) { return static_cast<float*>(m.data) + r * m.ld; }

void require_f32(const Mat& m, const char* op) {
  if (m.dtype != DType::F32) throw Error(std::string("cpu backend: ") + op + " expects f32 activations");
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

constexpr int64_t kParallelWork = int64_t(1) << 15;

}  // namespace

void causal_conv1d(const CausalConv1dParams& p, int threads) {
  require_f32(p.x, "causal_conv1d");
  require_f32(p.out, "causal_conv1d");
  const int K = p.kernel;
  const int64_t C = p.x.cols, T = p.x.rows;
  if (K < 2 || K > 8) throw Error("cpu backend: causal_conv1d kernel size " + std::to_string(K) + " (2..8 supported)");
  if (p.out.cols != C || p.out.rows != T) throw Error("cpu backend: causal_conv1d shape mismatch");
  if (T == 0) return;
  const std::vector<Segment> segs = segments(p.meta, T, "causal_conv1d");
  const std::vector<float> w = widen(p.weight, p.weight_dtype, C * K);
  const int64_t n_seg = int64_t(segs.size());
#pragma omp parallel for num_threads(threads) schedule(static) collapse(2) if (T * C * K >= kParallelWork)
  for (int64_t si = 0; si < n_seg; ++si) {
    for (int64_t c = 0; c < C; ++c) {
      const Segment& g = segs[size_t(si)];
      float* st = p.state + (int64_t(g.row) * C + c) * (K - 1);
      const float* wc = w.data() + c * K;
      float hist[8];  // inputs at slots first - (K - 1) .. first - 1, then a sliding window
      for (int i = 0; i < K - 1; ++i) hist[i] = int64_t(g.first_slot) - (K - 1) + i < 0 ? 0.0f : st[i];
      for (int64_t t = g.start; t < g.start + g.len; ++t) {
        const float xv = frow(p.x, t)[c];  // read before the (possibly in-place) write
        float acc = 0.0f;
        for (int j = 0; j < K - 1; ++j) acc += wc[j] * hist[j];
        acc += wc[K - 1] * xv;
        frow(p.out, t)[c] = silu(acc);
        for (int j = 0; j + 1 < K - 1; ++j) hist[j] = hist[j + 1];
        hist[K - 2] = xv;
      }
      for (int i = 0; i < K - 1; ++i) st[i] = hist[i];
    }
  }
}

void gated_delta_rule(const GatedDeltaRuleParams& p, int threads) {
  for (const Mat* m : {&p.q, &p.k, &p.v, &p.b, &p.a, &p.out}) require_f32(*m, "gated_delta_rule");
  const int HK = p.k_heads, HV = p.v_heads, DK = p.d_k, DV = p.d_v;
  if (HK <= 0 || HV <= 0 || HV % HK != 0 || DK <= 0 || DV <= 0)
    throw Error("cpu backend: gated_delta_rule: v_heads " + std::to_string(HV) + " must be a positive multiple of k_heads " +
                std::to_string(HK) + " (and head dims positive)");
  const int64_t T = p.q.rows;
  if (T == 0) return;
  const std::vector<Segment> segs = segments(p.meta, T, "gated_delta_rule");
  const std::vector<float> a_log = widen(p.a_log, p.a_log_dtype, HV), dt_bias = widen(p.dt_bias, p.dt_bias_dtype, HV);
  const int group = HV / HK;
  const float q_scale = 1.0f / std::sqrt(float(DK));
  const int64_t n_seg = int64_t(segs.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic) collapse(2) if (T * HV * DK * DV >= kParallelWork)
  for (int64_t si = 0; si < n_seg; ++si) {
    for (int h = 0; h < HV; ++h) {
      const Segment& g = segs[size_t(si)];
      const int kh = h / group;
      float* S = p.state + (int64_t(g.row) * HV + h) * DK * DV;
      if (g.first_slot == 0)
        for (int64_t i = 0; i < int64_t(DK) * DV; ++i) S[i] = 0.0f;
      std::vector<float> q(static_cast<size_t>(DK)), k(static_cast<size_t>(DK)), u(static_cast<size_t>(DV));
      const float A = std::exp(a_log[size_t(h)]);
      for (int64_t t = g.start; t < g.start + g.len; ++t) {
        const float* qs = frow(p.q, t) + int64_t(kh) * DK;
        const float* ks = frow(p.k, t) + int64_t(kh) * DK;
        const float* vs = frow(p.v, t) + int64_t(h) * DV;
        float sq = 0.0f, sk = 0.0f;
        for (int i = 0; i < DK; ++i) {
          sq += qs[i] * qs[i];
          sk += ks[i] * ks[i];
        }
        const float rq = 1.0f / std::sqrt(sq + 1e-6f), rk = 1.0f / std::sqrt(sk + 1e-6f);
        for (int i = 0; i < DK; ++i) {
          q[size_t(i)] = qs[i] * rq * q_scale;
          k[size_t(i)] = ks[i] * rk;
        }
        const float beta = 1.0f / (1.0f + std::exp(-frow(p.b, t)[h]));
        const float decay = std::exp(-A * softplus(frow(p.a, t)[h] + dt_bias[size_t(h)]));
        // S = decay * S; u = S^T k
        for (int j = 0; j < DV; ++j) u[size_t(j)] = 0.0f;
        for (int i = 0; i < DK; ++i) {
          float* Si = S + int64_t(i) * DV;
          for (int j = 0; j < DV; ++j) {
            Si[j] *= decay;
            u[size_t(j)] += Si[j] * k[size_t(i)];
          }
        }
        // u = beta * (v - S^T k); S += k (x) u
        for (int j = 0; j < DV; ++j) u[size_t(j)] = beta * (vs[j] - u[size_t(j)]);
        float* o = frow(p.out, t) + int64_t(h) * DV;
        for (int j = 0; j < DV; ++j) o[j] = 0.0f;
        for (int i = 0; i < DK; ++i) {
          float* Si = S + int64_t(i) * DV;
          for (int j = 0; j < DV; ++j) {
            Si[j] += k[size_t(i)] * u[size_t(j)];
            o[j] += Si[j] * q[size_t(i)];
          }
        }
      }
    }
  }
}

void gated_rmsnorm(const GatedRmsNormParams& p, int threads) {
  for (const Mat* m : {&p.x, &p.z, &p.out}) require_f32(*m, "gated_rmsnorm");
  const int H = p.heads, D = p.dim;
  const int64_t T = p.x.rows;
  const std::vector<float> w = widen(p.weight, p.weight_dtype, D);
#pragma omp parallel for num_threads(threads) schedule(static) collapse(2) if (T * H * D >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const float* x = frow(p.x, t) + int64_t(h) * D;
      const float* z = frow(p.z, t) + int64_t(h) * D;
      float* o = frow(p.out, t) + int64_t(h) * D;
      float ss = 0.0f;
      for (int i = 0; i < D; ++i) ss += x[i] * x[i];
      const float inv = 1.0f / std::sqrt(ss / float(D) + p.eps);
      for (int i = 0; i < D; ++i) o[i] = w[size_t(i)] * (x[i] * inv) * silu(z[i]);
    }
  }
}

}  // namespace ingot::cpu
