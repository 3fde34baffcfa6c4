// The fixture of the CUDA op conformance programs (test_cuda_ops, test_cuda_int4_ops, test_cuda_sample_ops):
// the CUDA backend beside the CPU reference backend in the tested activation dtype, random values rounded to
// it, KV caches in either layout with their token metadata, and attention run on both backends; random INT4
// weights (also what test_cuda_f32_activations refuses). One header so that the programs, split by area, test
// alike.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "cuda_test_helpers.h"

#ifdef INGOT_WITH_CUDA
namespace ingot::test {
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
  std::vector<int32_t> order;  // TokenMeta::order, or empty: none given
};

inline Meta make_meta(const std::vector<Chunk>& chunks) {
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

inline TokenMeta put_meta(Side& s, const Meta& m) {
  return {s.put_i32(m.row), s.put_i32(m.slot), s.put_i32(m.pos), s.put_i32(m.kv_len),
          m.order.empty() ? nullptr : s.put_i32(m.order)};
}

class CudaOps : public CudaVsCpu {
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
  // The weight as a Mat on `s`, scales (and bias) in dtype `dt`; on a backend that re-lays INT4 weights
  // (CUDA: 8-row blocks where rows % 8 == 0 and K % 128 == 0), re-laid as a Model's load does.
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
    if (!s.be.host_memory()) s.be.relayout_int4(m);
    return m;
  }
};

// exact: scales m / 1024 with m in 1..15, so that every (nibble - zero) * scale has at most 8
// significant bits and is exact in f16 and bf16 too: the GPU's 16-bit weights then equal the CPU's f32
// ones, and a comparison sees only the accumulation and the output rounding (as for 16-bit weights).
// Otherwise scales are any values (the dequantization's rounding is then checked bit for bit elsewhere).
inline Int4Weight random_int4(std::mt19937& rng, int64_t N, int64_t K, int64_t G, bool zeros, bool perm, DType dt,
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

}  // namespace ingot::test
#endif
