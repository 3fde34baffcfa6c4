// Op-level conformance of the CUDA backend's sample and logprobs ops against the CPU reference
// (backend/sampling.h, backend/logprobs.h): the picks are the CPU's tokens exactly, over a Qwen-sized and
// a tiny vocabulary, every setting, every launch shape, and graph replay; and the sample op split over
// ranks (sample_part, sample_merge): the CPU's lists, picks and state exactly, and the whole-row op's
// picks. Skips without a GPU.
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
#include "backend/sampling.h"
#include "core/dtype.h"
#include "cuda_ops_fixture.h"
#include "cuda_test_helpers.h"
#include "test_helpers.h"

#ifdef INGOT_WITH_CUDA
namespace ingot {
namespace {

using namespace test;

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

// The kinds of logits row the sample tests draw from (rnd's spread unless changed).
enum class RowKind { Spread, Wide, Ties, AllEqual, SomeNegInf, FirstHalfNegInf, TwoDominant, Poisoned, AllNegInf, Rising };

// Row l [V] of kind k; a Poisoned row gets a NaN (nan) or +inf at column `at`.
void make_row(float* l, int64_t V, RowKind k, int64_t at, bool nan) {
  switch (k) {
    case RowKind::Spread: break;
    case RowKind::Wide: for (int64_t j = 0; j < V; ++j) l[j] *= 4.0f; break;
    case RowKind::Ties: for (int64_t j = 0; j < V; ++j) l[j] = std::round(l[j] * 2.0f) / 2.0f; break;
    case RowKind::AllEqual: std::fill(l, l + V, 1.25f); break;
    case RowKind::SomeNegInf: for (int64_t j = 0; j < V; j += 3) l[j] = -INFINITY; break;
    case RowKind::FirstHalfNegInf: std::fill(l, l + V / 2, -INFINITY); break;
    case RowKind::TwoDominant:
      for (int64_t j = 0; j < V; ++j) l[j] -= 30.0f;
      l[V / 2] = l[V / 3] = 10.0f;
      break;
    case RowKind::Poisoned: l[at % V] = nan ? NAN : INFINITY; break;  // no pick: -1, seen untouched
    case RowKind::AllNegInf: std::fill(l, l + V, -INFINITY); break;  // nothing finite: -1
    case RowKind::Rising: for (int64_t j = 0; j < V; ++j) l[j] = float(j) * (8.0f / float(V)); break;
  }
}

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
    const RowKind kinds[] = {RowKind::Spread,     RowKind::Wide,        RowKind::Ties,     RowKind::AllEqual,
                             RowKind::SomeNegInf, RowKind::TwoDominant, RowKind::Poisoned, RowKind::AllNegInf};
    for (int64_t r = 0; r < R; ++r) make_row(lg.data() + r * V, V, kinds[r % 8], r * 13, r % 16 == 6);
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

// ---- the sample op split over ranks (sample_part / sample_merge) ------------------------------------

// Settings the split takes (sampling::split_draw_suits): the argmax with and without the penalty, top_k
// 1, top_k 40 with top-p, top_k 64 alone and with min-p, small top_k with every filter and the
// additive penalties.
const std::vector<SampleParams> kSplitSettings = {
    {0.0f, 0, 1.0f, 0.0f, 1.0f, 0},    {0.0f, 0, 1.0f, 0.0f, 1.3f, 0},       {0.8f, 1, 1.0f, 0.0f, 1.0f, 0},
    {0.8f, 40, 0.9f, 0.0f, 1.0f, 0},   {1.0f, 64, 1.0f, 0.0f, 1.0f, 0},      {1.3f, 64, 1.0f, 0.05f, 1.0f, 0},
    {0.7f, 20, 0.5f, 0.1f, 1.3f, 0, 0.4f, 0.3f}, {2.0f, 7, 0.95f, 0.0f, 1.1f, 0, 0.0f, 1.0f},
    {5.0f, 64, 0.999f, 0.0f, 1.0f, 0},
};

// A pair of candidate lists equal field by field: key and flag exactly, the score's bits exactly but
// for NaN, which is NaN on both sides (the CPU keeps a NaN logit's payload through the multiply, the
// GPU gives the canonical NaN; a NaN logit poisons its row, so its score never reaches a draw).
void expect_same_candidates(const std::vector<SampleCandidate>& got, const std::vector<SampleCandidate>& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const SampleCandidate &g = got[i], &w = want[i];
    const bool score_same = std::isnan(w.score) ? std::isnan(g.score) : std::memcmp(&g.score, &w.score, 4) == 0;
    if (g.key != w.key || g.flag != w.flag || !score_same) {
      if (bad++ < 5)
        ADD_FAILURE() << what << ": candidate " << i << " (row list entry " << i % kSampleCandidates << ") got key "
                      << g.key << " score " << g.score << " flag " << g.flag << ", want key " << w.key << " score "
                      << w.score << " flag " << w.flag;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " candidates differ";
}

// A host vector's bytes in a new buffer of `be`, kept by s.
template <typename X>
X* put_vec(Side& s, const std::vector<X>& v) {
  s.keep.emplace_back(s.be, std::max<size_t>(v.size() * sizeof(X), 1));
  s.be.upload(s.keep.back().get(), v.data(), v.size() * sizeof(X));
  return s.keep.back().as<X>();
}
template <typename X>
std::vector<X> get_vec(Side& s, const X* p, size_t n) {
  std::vector<X> v(n);
  s.be.download(v.data(), p, n * sizeof(X));
  return v;
}

// Rank w of `world` owns columns [from[w], from[w + 1]): uneven cuts (13 more or 29 fewer columns than
// an even share on a large vocabulary, 1 more or 2 fewer on a small one).
std::vector<int64_t> uneven_cuts(int64_t V, int world) {
  std::vector<int64_t> from = {0};
  for (int w = 1; w < world; ++w) from.push_back(V * w / world + (V >= 1000 ? (w % 2 ? 13 : -29) : (w % 2 ? 1 : -2)));
  from.push_back(V);
  return from;
}

// The split ops against the CPU's: every rank's sample_part list field by field (keys, scores, flags),
// then sample_merge's picks, and after three draws the seen marks, counts and draw counters; and the
// split's picks and state against the CUDA whole-row sample op's. A Qwen-sized vocabulary (slices of
// 38k to 152k columns), a mid-sized one and one of 37 tokens (slices of 7 to 37 columns: lists padded
// with key 0), over 1, 2 and 4 ranks cut unevenly (offsets > 0 on every rank but the first); rows of
// every kind (spread, wide, heavy ties, all equal, -inf columns, a rank's slice all -inf, two dominant
// tokens, a NaN or +inf, all -inf, logits rising with the column), each split-suited setting, state
// rows through an indirection, seen marks and counts on.
TEST_P(CudaOps, SampleSplitMatchesCpuAndWholeRow) {
  ASSERT_TRUE(gpu_be_->sample_split());
  int compared = 0;
  for (int64_t V : {int64_t(151936), int64_t(5003), int64_t(37)}) {
    const int64_t R = V > 100000 ? 10 : 20;
    std::vector<float> lg = rnd(size_t(R * V), 2.0f);
    // FirstHalfNegInf: the first ranks see no finite logit.
    const RowKind kinds[] = {RowKind::Spread,     RowKind::Wide,       RowKind::Ties,          RowKind::AllEqual,
                             RowKind::SomeNegInf, RowKind::FirstHalfNegInf, RowKind::TwoDominant, RowKind::Poisoned,
                             RowKind::AllNegInf,  RowKind::Rising};
    for (int64_t r = 0; r < R; ++r) make_row(lg.data() + r * V, V, kinds[r % 10], r * 13, r % 20 == 7);
    lg = round_dt(lg);
    std::vector<SampleParams> params(static_cast<size_t>(R));
    std::vector<uint32_t> step(static_cast<size_t>(R));
    std::vector<int32_t> state_of(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      SampleParams& p = params[size_t(r)];
      p = kSplitSettings[size_t(r * 7) % kSplitSettings.size()];
      p.seed = 500 + uint64_t(r);
      if (r % 3 == 1) {  // every third row also takes the additive penalties, one of them negative
        p.frequency_penalty = 0.4f;
        p.presence_penalty = r % 2 ? 1.1f : -0.7f;
      }
      step[size_t(r)] = uint32_t(rng_());
      state_of[size_t(r)] = int32_t((r * 7 + 3) % R);  // a permutation: 7 is prime to R
    }
    std::vector<uint8_t> seen0(static_cast<size_t>(R * V));
    for (uint8_t& x : seen0) x = rng_() % 20 == 0;
    std::vector<int32_t> counts0(static_cast<size_t>(R * V));
    for (int32_t& x : counts0) x = rng_() % 25 == 0 ? int32_t(1 + rng_() % 4) : 0;
    for (int world : {1, 2, 4}) {
      const std::vector<int64_t> from = uneven_cuts(V, world);
      Side& g = *gpu_;
      const size_t es = dtype_size(dt_);
      void* glogits = g.put(lg);
      const Mat glg = g.m(glogits, R, V);
      // Three states from the same start: the CPU's split, the GPU's split, the GPU's whole-row op.
      std::vector<uint32_t> cstep = step;
      std::vector<uint8_t> cseen = seen0;
      std::vector<int32_t> ccounts = counts0;
      SampleState cs{state_of.data(), params.data(), cstep.data(), cseen.data(), V, ccounts.data(), V};
      auto gpu_state = [&] {
        return SampleState{put_vec(g, state_of), put_vec(g, params), put_vec(g, step), put_vec(g, seen0), V,
                           put_vec(g, counts0), V};
      };
      const SampleState gs = gpu_state(), gw = gpu_state();
      SampleCandidate* gparts = put_vec(g, std::vector<SampleCandidate>(size_t(world * R * kSampleCandidates)));
      std::vector<SampleCandidate> cparts(size_t(world * R * kSampleCandidates));
      int32_t* gout = g.put_i32(std::vector<int32_t>(size_t(R), 77));
      int32_t* gwhole = g.put_i32(std::vector<int32_t>(size_t(R), 77));
      std::vector<int32_t> cout(size_t(R), 77);
      for (int call = 0; call < 3; ++call) {
        const std::string what = "vocab " + std::to_string(V) + " world " + std::to_string(world) + " call " +
                                 std::to_string(call);
        for (int w = 0; w < world; ++w) {
          const int64_t cols = from[size_t(w) + 1] - from[size_t(w)];
          gpu_be_->sample_part(Mat{static_cast<uint8_t*>(glogits) + size_t(from[size_t(w)]) * es, dt_, R, cols, V},
                               from[size_t(w)], gs, gparts + w * R * kSampleCandidates);
          cpu_be_->sample_part(Mat{lg.data() + from[size_t(w)], DType::F32, R, cols, V}, from[size_t(w)], cs,
                               cparts.data() + w * R * kSampleCandidates);
        }
        expect_same_candidates(get_vec(g, gparts, cparts.size()), cparts, what + ": sample_part lists");
        gpu_be_->sample_merge(gparts, R, world, gs, gout);
        cpu_be_->sample_merge(cparts.data(), R, world, cs, cout.data());
        gpu_be_->sample(glg, gw, gwhole);
        const std::vector<int32_t> got = g.get_i32(gout, size_t(R)), whole = g.get_i32(gwhole, size_t(R));
        for (int64_t r = 0; r < R; ++r) {
          EXPECT_EQ(got[size_t(r)], cout[size_t(r)])
              << what << " row " << r << " (kind " << r % 10 << ", " << describe(params[size_t(state_of[size_t(r)])])
              << "): CUDA sample_merge vs the CPU's";
          EXPECT_EQ(got[size_t(r)], whole[size_t(r)])
              << what << " row " << r << " (kind " << r % 10 << "): CUDA split vs the CUDA whole-row sample op";
        }
        // The rows that have no pick have none either way.
        for (int64_t r = 7; r < R; r += 10) EXPECT_EQ(cout[size_t(r)], sampling::kNoToken) << what << " row " << r;
        for (int64_t r = 8; r < R; r += 10) EXPECT_EQ(cout[size_t(r)], sampling::kNoToken) << what << " row " << r;
        ++compared;
      }
      const std::string what = "vocab " + std::to_string(V) + " world " + std::to_string(world);
      EXPECT_EQ(get_vec(g, gs.step, size_t(R)), cstep) << what << ": draw counters (split vs CPU)";
      EXPECT_EQ(cstep[0], step[0] + 3) << what;
      EXPECT_EQ(get_vec(g, gw.step, size_t(R)), cstep) << what << ": draw counters (whole row vs CPU)";
      EXPECT_TRUE(get_vec(g, gs.seen, cseen.size()) == cseen) << what << ": seen marks (split vs CPU)";
      EXPECT_TRUE(get_vec(g, gw.seen, cseen.size()) == cseen) << what << ": seen marks (whole row vs CPU)";
      EXPECT_TRUE(get_vec(g, gs.counts, ccounts.size()) == ccounts) << what << ": counts (split vs CPU)";
      EXPECT_TRUE(get_vec(g, gw.counts, ccounts.size()) == ccounts) << what << ": counts (whole row vs CPU)";
      EXPECT_FALSE(ccounts == counts0) << what << ": the draws counted nothing";
    }
  }
  EXPECT_EQ(compared, 3 * 3 * 3);
}

// A row whose setting needs the whole row (top_k 0, or above kSampleCandidates, at a positive
// temperature): the CPU's merge throws; the CUDA merge, whose settings are in device memory, gives that
// row kNoToken and leaves its marks, counts and draw counter as they were, and picks the other rows of
// the call as the CPU's merge picks them.
TEST_P(CudaOps, SampleMergeRefusesWholeRowSettings) {
  const int64_t V = 3001, R = 4;
  const int world = 2;
  const std::vector<int64_t> from = uneven_cuts(V, world);
  const std::vector<float> lg = rnd(size_t(R * V), 2.0f);
  const std::vector<SampleParams> params = {{0.0f, 0, 1.0f, 0.0f, 1.2f, 1},
                                            {0.8f, 0, 0.9f, 0.0f, 1.0f, 2},
                                            {0.8f, 40, 0.9f, 0.0f, 1.0f, 3},
                                            {0.8f, kSampleCandidates + 1, 1.0f, 0.0f, 1.0f, 4}};
  ASSERT_TRUE(sampling::split_draw_suits(params[0]) && sampling::split_draw_suits(params[2]));
  ASSERT_FALSE(sampling::split_draw_suits(params[1]) || sampling::split_draw_suits(params[3]));
  const std::vector<uint32_t> step = {3, 4, 5, 6};
  std::vector<uint8_t> seen(size_t(R * V));
  for (size_t i = 0; i < seen.size(); i += 17) seen[i] = 1;
  std::vector<int32_t> counts(size_t(R * V));
  for (size_t i = 0; i < counts.size(); i += 23) counts[i] = 2;
  Side& g = *gpu_;
  const size_t es = dtype_size(dt_);
  void* glogits = g.put(lg);
  const SampleState gs{nullptr, put_vec(g, params), put_vec(g, step), put_vec(g, seen), V, put_vec(g, counts), V};
  std::vector<uint32_t> cstep = step;
  std::vector<uint8_t> cseen = seen;
  std::vector<int32_t> ccounts = counts;
  const SampleState cs{nullptr, params.data(), cstep.data(), cseen.data(), V, ccounts.data(), V};
  SampleCandidate* gparts = put_vec(g, std::vector<SampleCandidate>(size_t(world * R * kSampleCandidates)));
  std::vector<SampleCandidate> cparts(size_t(world * R * kSampleCandidates));
  for (int w = 0; w < world; ++w) {
    const int64_t cols = from[size_t(w) + 1] - from[size_t(w)];
    gpu_be_->sample_part(Mat{static_cast<uint8_t*>(glogits) + size_t(from[size_t(w)]) * es, dt_, R, cols, V},
                         from[size_t(w)], gs, gparts + w * R * kSampleCandidates);
    cpu_be_->sample_part(Mat{const_cast<float*>(lg.data()) + from[size_t(w)], DType::F32, R, cols, V},
                         from[size_t(w)], cs, cparts.data() + w * R * kSampleCandidates);
  }
  expect_same_candidates(get_vec(g, gparts, cparts.size()), cparts, "sample_part lists");
  {  // on a copy of the state: the CPU's merge records row 0 before it throws at row 1
    std::vector<uint32_t> step2 = step;
    std::vector<uint8_t> seen2 = seen;
    std::vector<int32_t> counts2 = counts;
    std::vector<int32_t> out2(static_cast<size_t>(R));
    EXPECT_THROW(cpu_be_->sample_merge(cparts.data(), R, world,
                                       SampleState{nullptr, params.data(), step2.data(), seen2.data(), V, counts2.data(), V},
                                       out2.data()),
                 Error);
  }
  int32_t* gout = g.put_i32(std::vector<int32_t>(size_t(R), 77));
  gpu_be_->sample_merge(gparts, R, world, gs, gout);
  const std::vector<int32_t> got = g.get_i32(gout, size_t(R));
  EXPECT_EQ(got[1], sampling::kNoToken);
  EXPECT_EQ(got[3], sampling::kNoToken);
  for (int64_t r : {int64_t(0), int64_t(2)}) {
    const int32_t want =
        sampling::merge_sample_parts(cparts.data() + r * kSampleCandidates, R * kSampleCandidates, world, params[size_t(r)], step[size_t(r)]);
    EXPECT_GE(want, 0) << "row " << r;
    EXPECT_EQ(got[size_t(r)], want) << "row " << r;
    cseen[size_t(r * V + want)] = 1;
    ++ccounts[size_t(r * V + want)];
    ++cstep[size_t(r)];
  }
  // Rows 0 and 2 marked, counted and advanced; rows 1 and 3 untouched.
  EXPECT_EQ(get_vec(g, gs.step, size_t(R)), (std::vector<uint32_t>{4, 4, 6, 6}));
  EXPECT_EQ(get_vec(g, gs.step, size_t(R)), cstep);
  EXPECT_TRUE(get_vec(g, gs.seen, seen.size()) == cseen);
  EXPECT_TRUE(get_vec(g, gs.counts, counts.size()) == ccounts);
}

// The split ops captured in a graph and replayed give the picks and state of the same calls run
// directly (the parts and the state live in buffers, so each replay draws anew).
TEST_P(CudaOps, SampleSplitGraphReplayMatchesDirect) {
  const int64_t V = 5003, R = 4;
  const int world = 2, calls = 5;
  const std::vector<int64_t> from = uneven_cuts(V, world);
  const std::vector<float> lg = rnd(size_t(R * V), 3.0f);
  const std::vector<SampleParams> params = {{0.9f, 40, 0.9f, 0.0f, 1.2f, 1},
                                            {1.0f, 64, 1.0f, 0.02f, 1.0f, 2},
                                            {0.0f, 0, 1.0f, 0.0f, 1.3f, 3},
                                            {1.5f, 5, 1.0f, 0.0f, 1.0f, 4, 0.3f, 0.2f}};
  const std::vector<uint32_t> step0 = {0, 10, 20, 30};
  const std::vector<uint8_t> seen0(size_t(R * V), 0);
  const std::vector<int32_t> counts0(size_t(R * V), 0);
  Side& g = *gpu_;
  const size_t es = dtype_size(dt_);
  void* glogits = g.put(lg);
  const SampleState st{nullptr, put_vec(g, params), put_vec(g, step0), put_vec(g, seen0), V, put_vec(g, counts0), V};
  SampleCandidate* parts = put_vec(g, std::vector<SampleCandidate>(size_t(world * R * kSampleCandidates)));
  int32_t* out = g.put_i32(std::vector<int32_t>(size_t(R)));
  auto body = [&] {
    for (int w = 0; w < world; ++w)
      gpu_be_->sample_part(Mat{static_cast<uint8_t*>(glogits) + size_t(from[size_t(w)]) * es, dt_, R,
                               from[size_t(w) + 1] - from[size_t(w)], V},
                           from[size_t(w)], st, parts + w * R * kSampleCandidates);
    gpu_be_->sample_merge(parts, R, world, st, out);
  };
  auto reset = [&] {
    gpu_be_->upload(st.step, step0.data(), step0.size() * 4);
    gpu_be_->upload(st.seen, seen0.data(), seen0.size());
    gpu_be_->upload(st.counts, counts0.data(), counts0.size() * 4);
  };
  std::vector<std::vector<int32_t>> direct, replayed;
  for (int k = 0; k < calls; ++k) {
    body();
    direct.push_back(g.get_i32(out, size_t(R)));
  }
  const std::vector<uint8_t> seen_direct = get_vec(g, st.seen, seen0.size());
  const std::vector<int32_t> counts_direct = get_vec(g, st.counts, counts0.size());
  reset();
  auto graph = gpu_be_->capture(body);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(get_vec(g, st.step, size_t(R)), step0) << "capture must not execute";
  for (int k = 0; k < calls; ++k) {
    graph->replay();
    replayed.push_back(g.get_i32(out, size_t(R)));
  }
  EXPECT_EQ(replayed, direct);
  EXPECT_TRUE(get_vec(g, st.seen, seen0.size()) == seen_direct);
  EXPECT_TRUE(get_vec(g, st.counts, counts0.size()) == counts_direct);
  EXPECT_EQ(get_vec(g, st.step, size_t(R)), (std::vector<uint32_t>{calls, 10 + calls, 20 + calls, 30 + calls}));
  std::set<int32_t> row0;
  for (const auto& d : direct) row0.insert(d[0]);
  EXPECT_GT(row0.size(), 1u) << "row 0 samples: successive draws should differ";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ingot
#else
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
