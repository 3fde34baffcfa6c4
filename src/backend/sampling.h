// The exact definition of the backends' `sample` op, shared by the CPU reference
// (src/backend/cpu/cpu_backend.cpp) and the CUDA kernel (src/backend/cuda/sample.cu): the random
// stream, the score of a logit, the order of candidates and the fixed-point weights. Written by us
// (Philox4x32-10 from its published description, Salmon et al., SC11); no library offers a counter
// RNG that both g++ and nvcc compile to the same bits.
//
// Both sides must pick the same token for the same logits and state, so every float step here is one
// explicitly rounded IEEE operation that no compiler may fuse or reorder (g++ contracts a*b+c into an
// FMA under -std=gnu++20, nvcc does under -fmad=true), the exponential is our own polynomial rather
// than a libm whose last bit differs between the two, and sums of probability are exact integer sums
// of fixed-point weights, so the order in which a GPU reduces them cannot change them.
//
// One row, logits l[0, V), settings p, seen[i] (the token is in the row's history: prompt and
// generated), count[i] (times the token was generated, the prompt not counted), draw counter step:
//  1. s_i = score(l_i, seen_i, count_i), in this order, each one rounded operation:
//     a. the repetition penalty (transformers'): a seen token's logit is divided by it when positive,
//        multiplied by it otherwise;
//     b. when count_i > 0, s_i = s_i - frequency_penalty * float(count_i), then
//        s_i = s_i - presence_penalty (OpenAI's penalties, applied after the repetition penalty and
//        before the temperature, frequency then presence, as vLLM applies them);
//     c. s_i = s_i * (1 / temperature).
//  2. Candidates are ordered by s descending, ties by lower id: `composite(order_key(s_i), i)`
//     descending. temperature <= 0: the first candidate (the argmax after the penalty).
//  3. top = the first candidate, m = its score; w_i = weight(s_i, m) in [0, 1] (1 at the top, 0 more
//     than 32 below it); W_i = fixed(w_i) = floor(w_i * 2^40).
//  4. top-k: keep the first min(top_k, V) candidates (all when top_k = 0); total = sum of their W.
//  5. min-p: cut before the first kept candidate after the top with w < min_p (relative to the top,
//     whose w is 1).
//  6. top-p: the shortest prefix of what is kept whose running W reaches top_p_target(top_p, total),
//     or all that is kept when it never does.
//  7. mass = the kept W (never 0: the top weighs 2^40; the top is the fallback all the same).
//     r = mulhi(random_bits(seed, step), mass), uniform in [0, mass), and the pick is the first kept
//     candidate whose running W exceeds r (the inverse CDF in candidate order).
// Before all of it: a row with a NaN or +inf logit, or with no finite logit (all -inf), has no pick
// and gives kNoToken. Its softmax is NaN (transformers' multinomial refuses it); such logits come from
// overflowed activations or broken weights. -inf entries beside finite ones are tokens of probability
// 0, as usual.
// The op then marks the pick in seen and adds one to its count (neither for kNoToken) and advances
// step. Counts of tokens never generated are 0, so the additive penalties leave them alone.
//
// The argmax op shares the rule: the first maximum of the row, or kNoToken; argmax_row below is its
// definition.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/backend.h"

#if defined(__CUDACC__)
#define INGOT_HD __host__ __device__ __forceinline__
#else
#define INGOT_HD inline
#endif

namespace ingot::sampling {

// ---- Philox4x32-10 ----------------------------------------------------------------------------

struct Philox4 {
  uint32_t v[4];
};

INGOT_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key schedule: Weyl increments between rounds
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t(0xD2511F53u) * c.v[0];
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c.v[2];
    c = Philox4{{uint32_t(p1 >> 32) ^ c.v[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c.v[3] ^ k1, uint32_t(p0)}};
  }
  return c;
}

// 64 random bits of draw `step` of the stream `seed`: counter (step, 0, 0, 0), key = the seed.
INGOT_HD uint64_t random_bits(uint64_t seed, uint32_t step) {
  const Philox4 o = philox4x32_10(Philox4{{step, 0u, 0u, 0u}}, uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(o.v[1]) << 32) | o.v[0];
}

// The high 64 bits of a * b: maps 64 random bits onto [0, b) without modulo bias worth noticing.
INGOT_HD uint64_t mulhi64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  return uint64_t((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// ---- explicitly rounded float steps -----------------------------------------------------------

INGOT_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);  // never contracted into an FMA
#else
  float p = a * b;
  __asm__("" : "+x"(p));  // the product is materialised: g++ cannot fuse it into a later add
  return p;
#endif
}
INGOT_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
INGOT_HD float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
INGOT_HD float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
INGOT_HD float rint_rn(float x) {
#ifdef __CUDA_ARCH__
  return rintf(x);
#else
  return std::nearbyint(x);  // round half to even, the default mode
#endif
}

INGOT_HD uint32_t bits_of(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
INGOT_HD float float_of(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// ---- scores, order, weights -------------------------------------------------------------------

// The pick of a row whose logits are not all finite, from both the argmax and the sample op.
constexpr int32_t kNoToken = -1;

// By the bits, so that no fast-math setting changes the answer: not NaN and not an infinity...
INGOT_HD bool is_finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }
// ...and NaN or +inf, a logit that leaves its row without a pick.
INGOT_HD bool poisons_row(float x) {
  const uint32_t u = bits_of(x);
  return (u & 0x7fffffffu) > 0x7f800000u || u == 0x7f800000u;
}

// 1 / temperature, or 1 when the row takes the argmax (the scores are then only penalised).
INGOT_HD float inverse_temperature(float temperature) {
  return temperature > 0.0f ? div_rn(1.0f, temperature) : 1.0f;
}

INGOT_HD float score(float logit, bool seen, float penalty, float inv_temp) {
  float s = logit;
  if (seen) s = s > 0.0f ? div_rn(s, penalty) : mul_rn(s, penalty);
  return mul_rn(s, inv_temp);
}

// Step 1 with the additive penalties: count = times the token was generated (0 when the row keeps no
// counts or neither penalty is on). float(count) is exact below 2^24, far beyond any cache row.
INGOT_HD float score(float logit, bool seen, float penalty, int32_t count, float frequency, float presence,
                     float inv_temp) {
  float s = logit;
  if (seen) s = s > 0.0f ? div_rn(s, penalty) : mul_rn(s, penalty);
  if (count > 0) {
    s = sub_rn(s, mul_rn(frequency, float(count)));
    s = sub_rn(s, presence);
  }
  return mul_rn(s, inv_temp);
}

// Whether a row's settings read the counts at all.
INGOT_HD bool counts_penalise(const SampleParams& p) { return p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f; }

// A key whose unsigned order is the scores' order: NaN lowest, -0 equal to +0.
INGOT_HD uint32_t order_key(float s) {
  if (s != s) return 0;
  uint32_t u = bits_of(s);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Candidate order as one integer: score key high, id low (inverted, so lower ids rank higher).
// Distinct for distinct ids, and never 0 for a real token, so 0 can mean "none".
INGOT_HD uint64_t composite(uint32_t key, uint32_t id) { return (uint64_t(key) << 32) | (0xFFFFFFFFu - id); }
INGOT_HD int32_t composite_id(uint64_t c) { return int32_t(0xFFFFFFFFu - uint32_t(c)); }

// Scores more than this far below the top weigh zero; within it exp() is at least e^-32 and the
// fixed-point weight below takes care of the rest. A score is within reach iff it is the top's or no
// more than 32 below it: an upper set of the candidate order.
constexpr float kReach = 32.0f;
INGOT_HD bool in_reach(float s, float top) { return s == top || sub_rn(s, top) >= -kReach; }

// exp(d) for d in [-32, 0): d = k ln2 + r with |r| <= ln2 / 2 (ln2 split in two so k ln2 is exact),
// a degree-7 Taylor polynomial for exp(r) (truncation error below 6e-9 relative), times 2^k built from
// its bits (k in [-47, 0], so the result stays normal).
INGOT_HD float exp_nonpositive(float d) {
  const float k = rint_rn(mul_rn(d, 1.44269504088896341f));
  float r = fma_rn(k, -0.693145751953125f, d);
  r = fma_rn(k, -1.428606765330187045e-06f, r);
  float p = 1.0f / 5040.0f;
  p = fma_rn(p, r, 1.0f / 720.0f);
  p = fma_rn(p, r, 1.0f / 120.0f);
  p = fma_rn(p, r, 1.0f / 24.0f);
  p = fma_rn(p, r, 1.0f / 6.0f);
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);
  return mul_rn(p, float_of(uint32_t(int32_t(k) + 127) << 23));
}

// exp(s - top), exactly 1 at the top and 0 out of reach.
INGOT_HD float weight(float s, float top) {
  if (s == top) return 1.0f;
  const float d = sub_rn(s, top);
  return d >= -kReach ? exp_nonpositive(d) : 0.0f;
}

// The fixed-point weight: floor(w * 2^40). Sums over any vocabulary below 2^24 tokens fit 64 bits.
INGOT_HD uint64_t fixed(float w) { return uint64_t(mul_rn(w, 0x1p40f)); }

// The running weight top-p must reach: ceil(top_p * total), never above total.
INGOT_HD uint64_t top_p_target(float top_p, uint64_t total) {
#ifdef __CUDA_ARCH__
  const double t = ceil(__dmul_rn(double(top_p), double(total)));
#else
  double t = double(top_p) * double(total);
  __asm__("" : "+x"(t));
  t = std::ceil(t);
#endif
  const uint64_t v = uint64_t(t);
  return v < total ? v : total;
}

// ---- pieces the backends' ops share ------------------------------------------------------------
// Host and device alike, so that the CPU reference and the CUDA split ops (cuda/sample_split.cu) run
// the same code for step 1's scores, steps 4-7 over a list of candidates and the op's bookkeeping.

// Step 1 for a row's settings, what does not change along the row worked out once: score(logit, i) of
// vocabulary entry i (seen and counts indexed by entry, each may be null; each read only where its
// penalty is on).
struct RowScorer {
  INGOT_HD RowScorer(const SampleParams& p, const uint8_t* seen_, const int32_t* counts_)
      : seen(seen_ != nullptr && p.repetition_penalty != 1.0f ? seen_ : nullptr),
        counts(counts_ != nullptr && counts_penalise(p) ? counts_ : nullptr), penalty(p.repetition_penalty),
        frequency(p.frequency_penalty), presence(p.presence_penalty), inv_temp(inverse_temperature(p.temperature)) {}
  INGOT_HD float operator()(float logit, int64_t i) const {
    return score(logit, seen != nullptr && seen[i] != 0, penalty, counts != nullptr ? counts[i] : 0, frequency,
                 presence, inv_temp);
  }
  const uint8_t* seen;    // null: no repetition penalty to apply
  const int32_t* counts;  // null: no additive penalty to apply
  float penalty, frequency, presence, inv_temp;
};

// A candidate in reach of the top (steps 3-7).
struct Cand {
  uint64_t c;  // composite(order_key(score), id)
  float w;     // weight(score, top)
  uint64_t W;  // fixed(w)
};

// A candidate of score s in reach of the top score m (step 3's weights).
INGOT_HD Cand in_reach_cand(uint64_t key, float s, float m) {
  const float w = weight(s, m);
  return {key, w, fixed(w)};
}

// Steps 4-7 once the candidates in reach of the top are known, cand[0, keep) being the first `keep`
// of them in order (keep = min(top_k, in reach), top_k applied): min-p, top-p and the draw.
INGOT_HD int32_t draw_kept(const Cand* cand, size_t keep, const SampleParams& p, uint32_t step, int32_t top) {
  uint64_t total = 0;
  for (size_t j = 0; j < keep; ++j) total += cand[j].W;
  if (p.min_p > 0.0f) {
    size_t j = 1;
    while (j < keep && cand[j].w >= p.min_p) ++j;
    if (j < keep) keep = j;
  }
  uint64_t mass = 0;
  for (size_t j = 0; j < keep; ++j) mass += cand[j].W;
  if (p.top_p < 1.0f) {
    const uint64_t target = top_p_target(p.top_p, total);
    if (target >= 1 && target <= mass) {
      uint64_t acc = 0;
      size_t j = 0;
      while (acc < target) acc += cand[j++].W;
      keep = j;
      mass = acc;
    }
  }
  if (mass == 0) return top;
  const uint64_t r = mulhi64(random_bits(p.seed, step), mass);
  uint64_t acc = 0;
  for (size_t j = 0; j < keep; ++j) {
    acc += cand[j].W;
    if (acc > r) return composite_id(cand[j].c);
  }
  return top;  // not reached: r < mass
}

// Steps 2-7 over a row's merged split candidates: merged[0, n) the first n (n >= 1) of the whole row's
// order (descending keys), for a setting split_draw_suits; cand: room for kSampleCandidates. Only the
// first top_k (<= kSampleCandidates) of the in-reach prefix can be kept, so n beyond kSampleCandidates
// changes nothing.
INGOT_HD int32_t draw_merged(const SampleCandidate* merged, int64_t n, const SampleParams& p, uint32_t step,
                             Cand* cand) {
  const int32_t top = composite_id(merged[0].key);
  if (!(p.temperature > 0.0f)) return top;
  // The in-reach candidates are a prefix of the order; keep = min(top_k, that prefix's length).
  const float m = merged[0].score;
  const int64_t limit = n < int64_t(p.top_k) ? n : int64_t(p.top_k);
  size_t keep = 0;
  while (int64_t(keep) < limit && in_reach(merged[keep].score, m)) {
    cand[keep] = in_reach_cand(merged[keep].key, merged[keep].score, m);
    ++keep;
  }
  return draw_kept(cand, keep, p, step, top);
}

// The sample ops' state row sr: its seen marks and counts (null where the state keeps none), and the
// bookkeeping after its pick t: marked and counted (neither for kNoToken), the draw counter advanced.
INGOT_HD uint8_t* seen_row(const SampleState& st, int64_t sr) { return st.seen ? st.seen + sr * st.seen_ld : nullptr; }
INGOT_HD int32_t* counts_row(const SampleState& st, int64_t sr) {
  return st.counts ? st.counts + sr * st.counts_ld : nullptr;
}
INGOT_HD void record_pick(const SampleState& st, int64_t sr, int32_t t) {
  if (t != kNoToken) {
    if (uint8_t* seen = seen_row(st, sr)) seen[t] = 1;
    if (int32_t* counts = counts_row(st, sr)) ++counts[t];
  }
  ++st.step[sr];
}

// ---- the reference ----------------------------------------------------------------------------

// One row through steps 1-7 on the host: f32 logits of `vocab` tokens, seen (null: nothing seen) of
// `vocab` flags, counts (null: nothing generated) of `vocab` counts, the row's draw counter. Neither
// marks seen, counts nor advances step (the op does).
int32_t sample_row(const float* logits, int64_t vocab, const SampleParams& p, const uint8_t* seen,
                   const int32_t* counts, uint32_t step);
inline int32_t sample_row(const float* logits, int64_t vocab, const SampleParams& p, const uint8_t* seen, uint32_t step) {
  return sample_row(logits, vocab, p, seen, nullptr, step);
}

// The sample op split over ranks (Backend::sample_part / sample_merge; SampleCandidate in backend.h).
// Whether the merged candidate lists decide a row of this setting: the argmax (temperature <= 0) or a
// top-k of at most kSampleCandidates. top_k = 0 with a positive temperature draws over every token
// in reach of the top, which only the whole row holds.
INGOT_HD bool split_draw_suits(const SampleParams& p) {
  return !(p.temperature > 0.0f) || (p.top_k >= 1 && p.top_k <= kSampleCandidates);
}
// This rank's kSampleCandidates candidates of one row: columns [offset, offset + cols) of the
// vocabulary at logits[0, cols), seen and counts indexed by vocabulary entry (each may be null), as
// step 1 scores them; out[0].flag marks a poisoned row or one without a finite logit here.
void sample_part_row(const float* logits, int64_t cols, int64_t offset, const SampleParams& p, const uint8_t* seen,
                     const int32_t* counts, SampleCandidate* out);
// The row's pick from its ranks' lists parts[0], parts[stride], ... (kSampleCandidates each): what
// sample_row gives over the whole row, for a setting split_draw_suits (an Error otherwise).
int32_t merge_sample_parts(const SampleCandidate* parts, int64_t stride, int world, const SampleParams& p,
                           uint32_t step);

// The argmax op on one row: the lowest index of the maximum, or kNoToken for a row with a NaN or +inf
// logit or none finite.
inline int32_t argmax_row(const float* logits, int64_t vocab) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (poisons_row(logits[i])) return kNoToken;
    if (is_finite(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  }
  return best < 0 ? kNoToken : int32_t(best);
}

// The argmax op's rule over columns [offset, offset + cols) of a row split across ranks (ArgmaxPart).
inline ArgmaxPart argmax_part_row(const float* logits, int64_t cols, int64_t offset) {
  ArgmaxPart p;
  for (int64_t j = 0; j < cols; ++j) {
    if (poisons_row(logits[j])) return ArgmaxPart{logits[j], kPartPoisoned};
    if (is_finite(logits[j]) && (p.index < 0 || logits[j] > p.value)) p = ArgmaxPart{logits[j], int32_t(offset + j)};
  }
  return p;
}

// The row's pick from its parts parts[0], parts[stride], ... (ranks in order, so ascending columns):
// kNoToken when a part is poisoned or none has a finite logit, else the largest value, ties to the
// earlier rank, whose index is the lower. That is argmax_row over the whole row: its first maximum is
// the first maximum of the first part that holds the maximum.
INGOT_HD int32_t merge_argmax_parts(const ArgmaxPart* parts, int64_t stride, int world) {
  int32_t best = kNoToken;
  float value = 0.0f;
  for (int w = 0; w < world; ++w) {
    const ArgmaxPart p = parts[int64_t(w) * stride];
    if (p.index == kPartPoisoned) return kNoToken;
    if (p.index >= 0 && (best < 0 || p.value > value)) {
      best = p.index;
      value = p.value;
    }
  }
  return best;
}

}  // namespace ingot::sampling
