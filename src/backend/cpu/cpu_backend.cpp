// The CPU backend: the reference every other backend is checked against, and a usable engine on its own.
// Activations and the KV cache are f32; weights stay in the dtype they were built in (f32, f16, bf16)
// and are widened in registers. Work is split over OpenMP threads by output rows or tokens, so results
// do not depend on the thread count (each output element is reduced by one thread in a fixed order).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/linear_attention.h"
#include "backend/int4_row.h"
#include "backend/logprobs.h"
#include "backend/sampling.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace ingot {
namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p, DType t) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == DType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16: high half of f32
}
inline float load1(const uint16_t* p, DType t) { return t == DType::F16 ? f16_to_f32(*p) : bf16_to_f32(*p); }

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), s0);
    s1 = _mm256_fmadd_ps(load8(a + i + 8), load8(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(load8(a + i + 16), load8(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(load8(a + i + 24), load8(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Dot of f32 activations with a 16-bit weight row, widening the weights on the fly (decode's hot loop).
float dot_16(const float* a, const uint16_t* w, DType t, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load8(a + i), load8(w + i, t), s0);
    s1 = _mm256_fmadd_ps(load8(a + i + 8), load8(w + i + 8, t), s1);
    s2 = _mm256_fmadd_ps(load8(a + i + 16), load8(w + i + 16, t), s2);
    s3 = _mm256_fmadd_ps(load8(a + i + 24), load8(w + i + 24, t), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(a + i), load8(w + i, t), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * load1(w + i, t);
  return s;
}

void row_to_f32(const void* src, DType t, float* dst, int64_t n) { convert_to_f32(t, src, dst, size_t(n)); }

inline const uint8_t* row_ptr(const Mat& m, int64_t r) {
  return static_cast<const uint8_t*>(m.data) + size_t(r * m.ld) * dtype_size(m.dtype);
}
inline float* frow(const Mat& m, int64_t r) { return static_cast<float*>(m.data) + r * m.ld; }

// The sample ops' row bookkeeping, shared with the CUDA backend (backend/sampling.h).
using sampling::counts_row;
using sampling::record_pick;
using sampling::seen_row;

// Below this much work (multiply-adds) an op runs on one thread: waking the team costs more than it
// saves, and far more when the cores are shared with other processes.
constexpr int64_t kParallelWork = int64_t(1) << 16;

void require_f32(const Mat& m, const char* op) {
  if (m.dtype != DType::F32) throw Error(std::string("cpu backend: ") + op + " expects f32 activations");
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {}
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::F32; }
  bool host_memory() const override { return true; }
  bool int4_weights() const override { return true; }
  std::optional<size_t> available_memory_bytes() const override { return host_available_bytes(); }

  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw Error("cpu backend: out of host memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void download(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void fill_zero(void* dst, size_t n) override { std::memset(dst, 0, n); }
  void synchronize() override {}

  void embedding(const Mat& table, const int32_t* ids, const Mat& out) override {
    require_f32(out, "embedding");
    for (int64_t t = 0; t < out.rows; ++t) {
      int32_t id = ids[t];
      if (id < 0 || id >= table.rows)
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(table.rows));
      row_to_f32(row_ptr(table, id), table.dtype, frow(out, t), table.cols);
    }
  }

  void add_rmsnorm(const Mat& x, const Mat* delta, const void* weight, DType wt, float eps, const Mat& out) override {
    require_f32(x, "add_rmsnorm");
    std::vector<float> w(size_t(x.cols));
    row_to_f32(weight, wt, w.data(), x.cols);
#pragma omp parallel for num_threads(threads_) schedule(static) if (x.rows * x.cols >= kParallelWork)
    for (int64_t t = 0; t < x.rows; ++t) {
      float* xr = frow(x, t);
      if (delta) {
        const float* d = frow(*delta, t);
        for (int64_t i = 0; i < x.cols; ++i) xr[i] += d[i];
      }
      double ss = 0;
      for (int64_t i = 0; i < x.cols; ++i) ss += double(xr[i]) * xr[i];
      float inv = 1.0f / std::sqrt(float(ss / double(x.cols)) + eps);
      float* o = frow(out, t);
      for (int64_t i = 0; i < x.cols; ++i) o[i] = w[i] * (xr[i] * inv);
    }
  }

  void linear(const Mat& x, const Mat& w, const void* bias, const Mat& y) override {
    require_f32(x, "linear");
    require_f32(y, "linear");
    if (x.cols != w.cols || y.cols != w.rows || y.rows != x.rows)
      throw Error("cpu backend: linear shape mismatch");
    const int64_t T = x.rows, N = w.rows, K = w.cols;
    const bool int4 = w.is_int4();
    if (int4 && (!w.int4.data || w.int4.group_size <= 0 || K % w.int4.group_size != 0 || w.ld * 2 != K))
      throw Error("cpu backend: linear: an INT4 weight needs its scales and a group size dividing its columns");
    if (int4 && (w.int4.layout != Int4Layout::Rows || w.int4.paired))
      throw Error("cpu backend: linear: INT4 weights are read in the row layout (quant/int4.h), not another backend's");
    std::vector<float> b;
    if (bias) {
      b.resize(size_t(N));
      row_to_f32(bias, int4 ? w.int4.dtype : w.dtype, b.data(), N);
    }
    const int64_t groups = int4 ? K / w.int4.group_size : 0;
    const size_t scale_row_bytes = size_t(groups) * (int4 ? dtype_size(w.int4.dtype) : 0);
    // Act-order weights read the input in their stored column order: gather it once.
    std::vector<float> xg;
    Mat xin = x;
    if (int4 && w.int4.perm) {
      xg.resize(size_t(T * K));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < K; ++j) xg[size_t(t * K + j)] = frow(x, t)[w.int4.perm[j]];
      xin = mat(xg.data(), DType::F32, T, K);
    }
#pragma omp parallel num_threads(threads_) if (T * N * K >= kParallelWork)
    {
      std::vector<float> wrow(int4 || (w.dtype != DType::F32 && T > 1) ? size_t(K) : 0);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t* wr = row_ptr(w, n);
        const float* wf = reinterpret_cast<const float*>(wr);
        if (int4) {
          // The row's exact f32 values, then the f32 product: the same arithmetic as an f32 weight that
          // holds the dequantized values, which the parity tests compare against.
          dequantize_int4_row(wr, static_cast<const uint8_t*>(w.int4.data) + size_t(n) * scale_row_bytes,
                              w.int4.dtype, K, w.int4.group_size, wrow.data(),
                              w.int4.zeros ? w.int4.zeros + size_t(n * groups) : nullptr);
          wf = wrow.data();
        } else if (w.dtype != DType::F32 && T > 1) {  // widen once, reuse for every token
          row_to_f32(wr, w.dtype, wrow.data(), K);
          wf = wrow.data();
        }
        for (int64_t t = 0; t < T; ++t) {
          const float* xr = frow(xin, t);
          float s = (int4 || w.dtype == DType::F32 || T > 1) ? dot_f32(xr, wf, K)
                                                     : dot_16(xr, reinterpret_cast<const uint16_t*>(wr), w.dtype, K);
          frow(y, t)[n] = bias ? s + b[size_t(n)] : s;
        }
      }
    }
  }

  void rope_cache_write(const RopeWriteParams& p) override {
    require_f32(p.qkv, "rope_cache_write");
    if (p.cache.dtype != DType::F32) throw Error("cpu backend: the KV cache must be f32");
    const int D = p.head_dim, half = p.rot_dim / 2;
    std::vector<float> qn, kn;
    if (p.q_norm) {
      qn.resize(size_t(D));
      kn.resize(size_t(D));
      row_to_f32(p.q_norm, p.norm_dtype, qn.data(), D);
      row_to_f32(p.k_norm, p.norm_dtype, kn.data(), D);
    }
#pragma omp parallel for num_threads(threads_) schedule(static) if (p.qkv.rows * p.qkv.cols >= kParallelWork)
    for (int64_t t = 0; t < p.qkv.rows; ++t) {
      float* row = frow(p.qkv, t);
      std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
      const float pos = float(p.meta.rope_pos[t]);
      for (int i = 0; i < half; ++i) {
        float ang = pos * p.inv_freq[i];
        cs[i] = float(std::cos(double(ang))) * p.attn_scale;
        sn[i] = float(std::sin(double(ang))) * p.attn_scale;
      }
      auto norm_rope = [&](float* h, const std::vector<float>& nw) {
        if (!nw.empty()) {
          double ss = 0;
          for (int i = 0; i < D; ++i) ss += double(h[i]) * h[i];
          float inv = 1.0f / std::sqrt(float(ss / D) + p.norm_eps);
          for (int i = 0; i < D; ++i) h[i] = nw[i] * (h[i] * inv);
        }
        for (int i = 0; i < half; ++i) {
          float x1 = h[i], x2 = h[i + half];
          h[i] = x1 * cs[i] - x2 * sn[i];
          h[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      };
      for (int h = 0; h < p.q_heads; ++h) norm_rope(row + h * D, qn);
      const int64_t r = p.meta.row[t], s = p.meta.slot[t];
      float* kc = static_cast<float*>(p.cache.k);
      float* vc = static_cast<float*>(p.cache.v);
      for (int h = 0; h < p.kv_heads; ++h) {
        float* k = row + (p.q_heads + h) * D;
        const float* v = row + (p.q_heads + p.kv_heads + h) * D;
        norm_rope(k, kn);
        const int64_t off = r * p.cache.batch_stride + h * p.cache.head_stride + s * p.cache.slot_stride;
        std::memcpy(kc + off, k, sizeof(float) * size_t(D));
        std::memcpy(vc + off, v, sizeof(float) * size_t(D));
      }
    }
  }

  void attention(const AttentionParams& p) override {
    require_f32(p.q, "attention");
    const int D = p.head_dim, group = p.q_heads / p.kv_heads;
    const float* kc = static_cast<const float*>(p.cache.k);
    const float* vc = static_cast<const float*>(p.cache.v);
#pragma omp parallel for num_threads(threads_) schedule(dynamic) collapse(2) \
    if (p.q.rows * p.q_heads * int64_t(p.max_kv_len) * D >= kParallelWork)
    for (int64_t t = 0; t < p.q.rows; ++t) {
      for (int h = 0; h < p.q_heads; ++h) {
        const float* q = frow(p.q, t) + h * D;
        float* o = frow(p.out, t) + h * D;
        const int64_t pos = p.meta.slot[t], kv_len = p.meta.kv_len[t], r = p.meta.row[t];
        int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
        int64_t hi = std::min<int64_t>(pos, kv_len - 1);  // causal and valid length
        std::fill(o, o + D, 0.0f);
        if (lo > hi) continue;  // nothing visible: zeros, never NaN
        const int64_t base = r * p.cache.batch_stride + (h / group) * p.cache.head_stride;
        std::vector<float> sc(size_t(hi - lo + 1));
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = lo; j <= hi; ++j) {
          sc[size_t(j - lo)] = dot_f32(q, kc + base + j * p.cache.slot_stride, D) * p.scale;
          mx = std::max(mx, sc[size_t(j - lo)]);
        }
        float sum = 0;
        for (float& s : sc) sum += (s = std::exp(s - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = lo; j <= hi; ++j) {
          const float pj = sc[size_t(j - lo)] * inv;
          const float* v = vc + base + j * p.cache.slot_stride;
          for (int i = 0; i < D; ++i) o[i] += pj * v[i];
        }
      }
    }
  }

  void swiglu(const Mat& gu, const Mat& out) override {
    require_f32(gu, "swiglu");
    const int64_t I = out.cols;
#pragma omp parallel for num_threads(threads_) schedule(static) if (gu.rows * out.cols >= kParallelWork)
    for (int64_t t = 0; t < gu.rows; ++t) {
      const float* g = frow(gu, t);
      const float* u = g + I;
      float* o = frow(out, t);
      for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }

  void sigmoid_gate(const Mat& x, const Mat& gate, const Mat& out) override {
    require_f32(x, "sigmoid_gate");
    require_f32(gate, "sigmoid_gate");
    if (gate.rows != x.rows || gate.cols != x.cols || out.rows != x.rows || out.cols != x.cols)
      throw Error("cpu backend: sigmoid_gate shape mismatch");
#pragma omp parallel for num_threads(threads_) schedule(static) if (x.rows * x.cols >= kParallelWork)
    for (int64_t t = 0; t < x.rows; ++t) {
      const float* a = frow(x, t);
      const float* g = frow(gate, t);
      float* o = frow(out, t);
      for (int64_t i = 0; i < x.cols; ++i) o[i] = a[i] * (1.0f / (1.0f + std::exp(-g[i])));
    }
  }

  void feed_picks(const int32_t* picks, const int32_t* from, int64_t n, int32_t* ids) override {
    for (int64_t i = 0; i < n; ++i)
      if (from[i] >= 0) ids[i] = std::max(picks[from[i]], 0);
  }
  void gather_rows(const Mat& src, const int32_t* idx, const Mat& dst) override {
    const size_t es = dtype_size(src.dtype);
    for (int64_t i = 0; i < dst.rows; ++i)
      std::memcpy(static_cast<uint8_t*>(dst.data) + size_t(i * dst.ld) * es, row_ptr(src, idx[i]), size_t(src.cols) * es);
  }

  void argmax(const Mat& logits, int32_t* out) override {
    require_f32(logits, "argmax");
    for (int64_t r = 0; r < logits.rows; ++r) out[r] = sampling::argmax_row(frow(logits, r), logits.cols);
  }
  void argmax_part(const Mat& logits, int64_t offset, ArgmaxPart* out) override {
    require_f32(logits, "argmax_part");
    for (int64_t r = 0; r < logits.rows; ++r) out[r] = sampling::argmax_part_row(frow(logits, r), logits.cols, offset);
  }
  void argmax_merge(const ArgmaxPart* parts, int64_t rows, int world, int32_t* out) override {
    for (int64_t r = 0; r < rows; ++r) out[r] = sampling::merge_argmax_parts(parts + r, rows, world);
  }

  bool sample_split() const override { return true; }
  void sample_part(const Mat& logits, int64_t offset, const SampleState& st, SampleCandidate* out) override {
    require_f32(logits, "sample_part");
    for (int64_t r = 0; r < logits.rows; ++r) {
      const int64_t sr = st.row ? st.row[r] : r;
      sampling::sample_part_row(frow(logits, r), logits.cols, offset, st.params[sr], seen_row(st, sr),
                                counts_row(st, sr), out + r * kSampleCandidates);
    }
  }
  void sample_merge(const SampleCandidate* parts, int64_t rows, int world, const SampleState& st,
                    int32_t* out) override {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t sr = st.row ? st.row[r] : r;
      out[r] = sampling::merge_sample_parts(parts + r * kSampleCandidates, rows * kSampleCandidates, world,
                                            st.params[sr], st.step[sr]);
      record_pick(st, sr, out[r]);
    }
  }

  void sample(const Mat& logits, const SampleState& st, int32_t* out) override {
    require_f32(logits, "sample");
    // Rows are independent (distinct state rows), so splitting them over threads changes nothing.
#pragma omp parallel for num_threads(threads_) schedule(dynamic) if (logits.rows > 1 && logits.rows * logits.cols >= kParallelWork)
    for (int64_t r = 0; r < logits.rows; ++r) {
      const int64_t sr = st.row ? st.row[r] : r;
      out[r] = sampling::sample_row(frow(logits, r), logits.cols, st.params[sr], seen_row(st, sr), counts_row(st, sr),
                                    st.step[sr]);
      record_pick(st, sr, out[r]);
    }
  }

  void logprobs(const Mat& logits, const int32_t* chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                float* top_lp) override {
    require_f32(logits, "logprobs");
    if (top_n < 0 || top_n > sampling::kMaxTopLogprobs)
      throw Error("cpu backend: logprobs top_n " + std::to_string(top_n) + " is outside [0, " +
                  std::to_string(sampling::kMaxTopLogprobs) + "]");
    for (int64_t r = 0; r < logits.rows; ++r)
      sampling::logprobs_row(frow(logits, r), logits.cols, chosen[r], top_n, chosen_lp + r, top_ids + r * top_n,
                             top_lp + r * top_n);
  }

  void to_f32(const Mat& src, float* dst) override {
    for (int64_t r = 0; r < src.rows; ++r) row_to_f32(row_ptr(src, r), src.dtype, dst + r * src.cols, src.cols);
  }

  // Linear attention: the reference lives in linear_attention.cpp.
  void causal_conv1d(const CausalConv1dParams& p) override { cpu::causal_conv1d(p, threads_); }
  void gated_delta_rule(const GatedDeltaRuleParams& p) override { cpu::gated_delta_rule(p, threads_); }
  void gated_rmsnorm(const GatedRmsNormParams& p) override { cpu::gated_rmsnorm(p, threads_); }

 private:
  int threads_;
};

}  // namespace

namespace sampling {

int32_t sample_row(const float* logits, int64_t V, const SampleParams& p, const uint8_t* seen, const int32_t* counts,
                   uint32_t step) {
  const RowScorer scorer(p, seen, counts);
  thread_local std::vector<float> s;
  s.resize(size_t(V));
  uint64_t best = 0;
  bool poisoned = false, any_finite = false;
  for (int64_t i = 0; i < V; ++i) {
    poisoned |= poisons_row(logits[i]);
    any_finite |= is_finite(logits[i]);
    s[size_t(i)] = scorer(logits[i], i);
    best = std::max(best, composite(order_key(s[size_t(i)]), uint32_t(i)));
  }
  if (poisoned || !any_finite) return kNoToken;
  const int32_t top = composite_id(best);
  if (!(p.temperature > 0.0f)) return top;

  // Only candidates within reach of the top can weigh anything; they are a prefix of the order, so
  // leaving the rest out changes no sum, no cut and no draw.
  const float m = s[size_t(top)];
  thread_local std::vector<Cand> cand;
  cand.clear();
  for (int64_t i = 0; i < V; ++i) {
    const float si = s[size_t(i)];
    if (in_reach(si, m)) cand.push_back(in_reach_cand(composite(order_key(si), uint32_t(i)), si, m));
  }
  size_t keep = cand.size();
  if (p.top_k > 0 && size_t(p.top_k) < keep) keep = size_t(p.top_k);
  std::partial_sort(cand.begin(), cand.begin() + long(keep), cand.end(),
                    [](const Cand& a, const Cand& b) { return a.c > b.c; });
  return draw_kept(cand.data(), keep, p, step, top);
}

void sample_part_row(const float* logits, int64_t cols, int64_t offset, const SampleParams& p, const uint8_t* seen,
                     const int32_t* counts, SampleCandidate* out) {
  const RowScorer scorer(p, seen, counts);
  thread_local std::vector<SampleCandidate> all;
  all.clear();
  bool poisoned = false, any_finite = false;
  for (int64_t j = 0; j < cols; ++j) {
    poisoned |= poisons_row(logits[j]);
    any_finite |= is_finite(logits[j]);
    const float sc = scorer(logits[j], offset + j);
    all.push_back({composite(order_key(sc), uint32_t(offset + j)), sc, 0});
  }
  const size_t n = std::min(all.size(), size_t(kSampleCandidates));
  std::partial_sort(all.begin(), all.begin() + long(n), all.end(),
                    [](const SampleCandidate& a, const SampleCandidate& b) { return a.key > b.key; });
  for (size_t k = 0; k < size_t(kSampleCandidates); ++k) out[k] = k < n ? all[k] : SampleCandidate{};
  out[0].flag = poisoned ? kPartPoisoned : any_finite ? 0 : kPartNoFinite;
}

int32_t merge_sample_parts(const SampleCandidate* parts, int64_t stride, int world, const SampleParams& p,
                           uint32_t step) {
  if (!split_draw_suits(p))
    throw Error("sample_merge: a setting of temperature > 0 and top_k " + std::to_string(p.top_k) +
                " needs the whole row (split draws take top_k 1.." + std::to_string(kSampleCandidates) + ")");
  thread_local std::vector<SampleCandidate> merged;
  merged.clear();
  bool any_finite = false;
  for (int w = 0; w < world; ++w) {
    const SampleCandidate* part = parts + int64_t(w) * stride;
    if (part[0].flag == kPartPoisoned) return kNoToken;
    any_finite |= part[0].flag != kPartNoFinite;
    for (int k = 0; k < kSampleCandidates && part[k].key != 0; ++k) merged.push_back(part[k]);
  }
  if (!any_finite || merged.empty()) return kNoToken;
  std::sort(merged.begin(), merged.end(), [](const SampleCandidate& a, const SampleCandidate& b) { return a.key > b.key; });
  // The in-reach candidates of the merged order are a prefix of it and hold the row's first top_k.
  Cand cand[kSampleCandidates];
  return draw_merged(merged.data(), int64_t(merged.size()), p, step, cand);
}

void logprobs_row(const float* logits, int64_t V, int32_t chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                  float* top_lp) {
  // The sum in double: the reference the GPU's float sum is compared with.
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i)
    if (is_finite(logits[i]) && logits[i] > m) m = logits[i];
  double sum = 0;
  if (is_finite(m))
    for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - double(m));
  const float z = is_finite(m) ? float(std::log(sum)) : NAN;
  auto lp = [&](int64_t t) { return (logits[t] - m) - z; };
  *chosen_lp = chosen >= 0 && chosen < V ? lp(chosen) : NAN;
  if (top_n <= 0) return;
  // The top_n largest ranks, kept sorted descending; a rank of 0 never belongs to a real token.
  uint64_t best[kMaxTopLogprobs] = {};
  const int n = int(std::min<int64_t>(top_n, V));
  for (int64_t i = 0; i < V; ++i) {
    const uint64_t c = logit_rank(logits[i], uint32_t(i));
    if (c <= best[n - 1]) continue;
    int j = n - 1;
    for (; j > 0 && best[j - 1] < c; --j) best[j] = best[j - 1];
    best[j] = c;
  }
  for (int k = 0; k < top_n; ++k) {
    const bool real = k < n;
    top_ids[k] = real ? composite_id(best[k]) : kNoToken;
    top_lp[k] = real ? lp(top_ids[k]) : NAN;
  }
}

}  // namespace sampling

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  // Threads beyond the hardware's only time-slice the same cores (every kernel is compute or memory
  // bound), and each costs a stack: 4x the hardware threads leaves room for experiments, while a
  // figure like 100000 would only exhaust the process before any work.
  const int hw = std::max(1, omp_get_num_procs());
  if (threads < 0) throw Error("CPU threads must be 0 (all cores) or positive, got " + std::to_string(threads));
  if (threads > 4 * hw)
    throw Error("CPU threads " + std::to_string(threads) + " exceed the limit of " + std::to_string(4 * hw) +
                " (4 x this machine's " + std::to_string(hw) + " hardware threads)");
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace ingot
