// Sampling on the CPU, the reference every backend's sample op is held to (backend/sampling.h): the
// Philox stream against its published known answers, reproducibility by seed, the draw's distribution,
// exactly which tokens top-k, top-p and min-p keep (ties included), the repetition penalty once per
// distinct token, the CPU backend's sample op (state rows, seen marks, draw counters) and Model::decode
// sampling from its device state exactly as a host Sampler does from forward()'s logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "backend/logprobs.h"
#include "backend/sampling.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "test_helpers.h"

namespace ingot {
namespace {

TEST(Philox, KnownAnswers) {
  // Random123's kat_vectors, the three philox4x32 10 lines: counter, key, result.
  struct Kat {
    sampling::Philox4 ctr;
    uint32_t k0, k1;
    sampling::Philox4 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    const sampling::Philox4 got = sampling::philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], k.want.v[i]) << "word " << i;
  }
}

TEST(Sampling, WeightsAndOrder) {
  using namespace sampling;
  EXPECT_EQ(weight(3.5f, 3.5f), 1.0f);
  EXPECT_EQ(fixed(1.0f), uint64_t(1) << 40);
  EXPECT_EQ(weight(-40.0f, 0.0f), 0.0f);  // out of reach
  for (float d : {-0.001f, -0.3466f, -0.5f, -1.0f, -7.25f, -20.0f, -31.9f})
    EXPECT_NEAR(weight(d, 0.0f), std::exp(double(d)), 2e-7 * std::exp(double(d))) << d;
  // The order: higher score first, then lower id; -0 ties +0; NaN below -inf.
  EXPECT_GT(composite(order_key(1.0f), 7), composite(order_key(0.5f), 0));
  EXPECT_GT(composite(order_key(1.0f), 3), composite(order_key(1.0f), 7));
  EXPECT_EQ(order_key(-0.0f), order_key(0.0f));
  EXPECT_GT(order_key(-INFINITY), order_key(NAN));
  EXPECT_GT(order_key(-1.0f), order_key(-2.0f));
  EXPECT_EQ(composite_id(composite(order_key(2.0f), 151935)), 151935);
  EXPECT_EQ(top_p_target(0.5f, 10), 5u);
  EXPECT_EQ(top_p_target(0.51f, 10), 6u);
}

SamplingParams temp(float t, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

// The tokens `p` ever picks from `logits` over many draws.
std::set<int32_t> picked(const std::vector<float>& logits, const SamplingParams& p, int draws = 4000) {
  Sampler s(p);
  std::set<int32_t> out;
  for (int i = 0; i < draws; ++i) out.insert(s.pick(logits.data(), int64_t(logits.size()), {}));
  return out;
}

std::vector<float> log_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

TEST(Sampler, SameSeedSameTokens) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = nd(rng);
  SamplingParams p = temp(0.8f, 42);
  p.top_p = 0.95f;
  p.repetition_penalty = 1.2f;
  auto run = [&](const SamplingParams& q) {
    Sampler s(q);
    std::vector<int32_t> hist, out;
    for (int i = 0; i < 60; ++i) {
      out.push_back(s.pick(logits.data(), int64_t(logits.size()), hist));
      hist.push_back(out.back());
    }
    return out;
  };
  const std::vector<int32_t> a = run(p);
  EXPECT_EQ(a, run(p));
  SamplingParams other = p;
  other.seed = 43;
  EXPECT_NE(a, run(other));
}

TEST(Sampler, DrawsFollowTheSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f};
  for (float t : {1.0f, 0.5f}) {
    Sampler s(temp(t, 7));
    const int n = 20000;
    std::vector<int> count(3);
    for (int i = 0; i < n; ++i) ++count[size_t(s.pick(logits.data(), 3, {}))];
    double z = 0;
    for (float l : logits) z += std::exp(double(l) / t);
    for (size_t i = 0; i < 3; ++i) {
      const double want = std::exp(double(logits[i]) / t) / z;
      EXPECT_NEAR(double(count[i]) / n, want, 0.01) << "token " << i << " at temperature " << t;
    }
  }
}

TEST(Sampler, GreedyTopKOneAndValidation) {
  std::vector<float> logits{0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
  SamplingParams g;
  EXPECT_EQ(Sampler(g).pick(logits.data(), 5, {}), 1);  // lowest index on ties
  SamplingParams k1;
  k1.temperature = 1.0f;
  k1.top_k = 1;
  k1.seed = 3;
  EXPECT_EQ(Sampler(k1).pick(logits.data(), 5, {}), 1);
  SamplingParams pen;
  pen.repetition_penalty = 4.0f;  // token 1 was seen: 2.0 / 4 = 0.5 < 2.0 of token 3
  EXPECT_EQ(Sampler(pen).pick(logits.data(), 5, {1}), 3);
  SamplingParams bad;
  bad.top_p = 0.0f;
  test::expect_error([&] { Sampler x(bad); }, {"--top-p"});
  bad = {};
  bad.temperature = -1;
  test::expect_error([&] { Sampler x(bad); }, {"--temperature"});
  bad = {};
  bad.min_p = 1.0f;
  test::expect_error([&] { Sampler x(bad); }, {"--min-p"});
  bad = {};
  bad.repetition_penalty = 0.0f;
  test::expect_error([&] { Sampler x(bad); }, {"--repetition-penalty"});
}

TEST(Sampler, TopKKeepsTheKBestWithTiesByLowerId) {
  // Order: 1, 2, 4 (tied at 5), 6, 0, 3, 5.
  const std::vector<float> logits = {3, 5, 5, 1, 5, 0, 4};
  auto with_k = [](int k) {
    SamplingParams p = temp(4.0f);
    p.top_k = k;
    return p;
  };
  EXPECT_EQ(picked(logits, with_k(1)), (std::set<int32_t>{1}));
  EXPECT_EQ(picked(logits, with_k(2)), (std::set<int32_t>{1, 2}));
  EXPECT_EQ(picked(logits, with_k(3)), (std::set<int32_t>{1, 2, 4}));
  EXPECT_EQ(picked(logits, with_k(4)), (std::set<int32_t>{1, 2, 4, 6}));
  EXPECT_EQ(picked(logits, with_k(0)), (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(picked(logits, with_k(100)), (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(Sampler, TopPKeepsTheShortestPrefixReachingP) {
  // Probabilities 0.5 (id 1), 0.3 (id 3), 0.15 (id 2), 0.05 (id 0).
  const std::vector<float> logits = log_of({0.05, 0.5, 0.15, 0.3});
  auto with_p = [](float p) {
    SamplingParams s = temp(1.0f);
    s.top_p = p;
    return s;
  };
  EXPECT_EQ(picked(logits, with_p(0.45f)), (std::set<int32_t>{1}));
  EXPECT_EQ(picked(logits, with_p(0.75f)), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(picked(logits, with_p(0.81f)), (std::set<int32_t>{1, 3, 2}));
  EXPECT_EQ(picked(logits, with_p(0.97f)), (std::set<int32_t>{0, 1, 2, 3}));
  // The cut inside a tie: 0.4 (id 2), then 0.2 at ids 0, 3 and 4 in that order; 0.5 needs one of
  // them, the lowest id; 0.7 two.
  const std::vector<float> tied = log_of({0.2, 1e-9, 0.4, 0.2, 0.2});
  EXPECT_EQ(picked(tied, with_p(0.5f)), (std::set<int32_t>{0, 2}));
  EXPECT_EQ(picked(tied, with_p(0.7f)), (std::set<int32_t>{0, 2, 3}));
  // top-p measures mass within the top-k set: with top-k 2 the top alone holds 0.4 / 0.6 = 0.67.
  SamplingParams kp = with_p(0.65f);
  EXPECT_EQ(picked(tied, kp), (std::set<int32_t>{0, 2, 3}));
  kp.top_k = 2;
  EXPECT_EQ(picked(tied, kp), (std::set<int32_t>{2}));
  kp.top_p = 0.7f;
  EXPECT_EQ(picked(tied, kp), (std::set<int32_t>{0, 2}));
}

TEST(Sampler, MinPKeepsTokensNearTheTop) {
  // Weights relative to the top: 1 (id 2), 0.61 (id 0), 0.37 (ids 1 and 4, tied), 0.05 (id 3).
  const std::vector<float> logits = {-0.5f, -1.0f, 0.0f, -3.0f, -1.0f};
  auto with_min = [](float m) {
    SamplingParams s = temp(1.0f);
    s.min_p = m;
    return s;
  };
  EXPECT_EQ(picked(logits, with_min(0.7f)), (std::set<int32_t>{2}));
  EXPECT_EQ(picked(logits, with_min(0.5f)), (std::set<int32_t>{0, 2}));
  EXPECT_EQ(picked(logits, with_min(0.3f)), (std::set<int32_t>{0, 1, 2, 4}));
  EXPECT_EQ(picked(logits, with_min(0.01f)), (std::set<int32_t>{0, 1, 2, 3, 4}));
  // min-p after top-k: only the kept tokens are looked at.
  SamplingParams km = with_min(0.3f);
  km.top_k = 3;
  EXPECT_EQ(picked(logits, km), (std::set<int32_t>{0, 1, 2}));
  // Temperature first: at 0.5 the weights square, 0.61 -> 0.37, below 0.5.
  SamplingParams tm = with_min(0.5f);
  tm.temperature = 0.5f;
  EXPECT_EQ(picked(logits, tm), (std::set<int32_t>{2}));
}

TEST(Sampler, PenaltyAppliesOncePerDistinctToken) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  // Positive logits are divided: 4 / 2 = 2 still beats 1.5; applied three times (0.5) it would not.
  const std::vector<float> pos = {4.0f, 1.5f, -1.0f};
  EXPECT_EQ(Sampler(p).pick(pos.data(), 3, {0, 0, 0}), 0);
  // ...and without the penalty 4 > 1.5 too, so also check it applies: 4 / 2 = 2 < 3.
  const std::vector<float> pos2 = {4.0f, 3.0f};
  EXPECT_EQ(Sampler(p).pick(pos2.data(), 2, {0, 0}), 1);
  // Negative logits are multiplied: -1 * 2 = -2 still beats -2.5; twice (-4) it would not.
  const std::vector<float> neg = {-1.0f, -2.5f, -9.0f};
  EXPECT_EQ(Sampler(p).pick(neg.data(), 3, {0, 0}), 0);
  const std::vector<float> neg2 = {-1.0f, -1.5f};
  EXPECT_EQ(Sampler(p).pick(neg2.data(), 2, {0}), 1);
}

// A NaN or +inf anywhere, or no finite logit, leaves the row without a pick: kNoToken from the
// Sampler, the sample op and the argmax op alike. -inf beside finite logits is a token of probability 0.
TEST(Sampler, RowsWithoutAPickGiveNoToken) {
  SamplingParams pen = temp(1.0f);
  pen.repetition_penalty = 1.5f;
  pen.top_k = 2;
  const std::vector<std::vector<float>> none = {
      std::vector<float>(5, NAN), {1.0f, 2.0f, NAN, 0.5f, 0.0f}, {1.0f, INFINITY, 0.0f, 0.0f, 0.0f},
      std::vector<float>(5, -INFINITY), {-INFINITY, -NAN, -INFINITY, -INFINITY, -INFINITY}};
  auto be = make_cpu_backend(1);
  for (const std::vector<float>& row : none) {
    for (const SamplingParams& p : {SamplingParams{}, temp(1.0f), pen}) {
      EXPECT_EQ(Sampler(p).pick(row.data(), 5, {1}), sampling::kNoToken) << row[0] << " " << row[1];
      // The op marks nothing and still advances the counter.
      const SampleParams sp = p.to_backend();
      uint32_t step = 4;
      std::vector<uint8_t> seen(5, 0);
      int32_t out = 7;
      be->sample(mat(const_cast<float*>(row.data()), DType::F32, 1, 5), SampleState{nullptr, &sp, &step, seen.data(), 5},
                 &out);
      EXPECT_EQ(out, sampling::kNoToken);
      EXPECT_EQ(step, 5u);
      EXPECT_EQ(seen, std::vector<uint8_t>(5, 0));
    }
    int32_t out = 7;
    be->argmax(mat(const_cast<float*>(row.data()), DType::F32, 1, 5), &out);
    EXPECT_EQ(out, sampling::kNoToken);
    EXPECT_EQ(sampling::argmax_row(row.data(), 5), sampling::kNoToken);
  }
  const std::vector<float> masked = {-INFINITY, -1.0f, -INFINITY, -0.5f, -INFINITY};
  EXPECT_EQ(sampling::argmax_row(masked.data(), 5), 3);
  EXPECT_EQ(Sampler(SamplingParams{}).pick(masked.data(), 5, {}), 3);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p = temp(1.0f);
    p.seed = seed;
    const int32_t t = Sampler(p).pick(masked.data(), 5, {});
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  // A row whose maximum is -FLT_MAX still has a pick.
  const std::vector<float> lowest = {-INFINITY, -3.4028235e38f, -INFINITY};
  EXPECT_EQ(sampling::argmax_row(lowest.data(), 3), 1);
}

// The argmax split over ranks (tensor parallelism): each rank's ArgmaxPart of its columns, merged in
// rank order, is the argmax of the whole row, for every way of cutting it into 1..4 parts: ties
// across a cut (the lower index wins), a NaN or +inf in any part, parts with no finite logit.
TEST(CpuArgmaxPart, MergedPartsAreTheArgmaxOfTheRow) {
  auto be = make_cpu_backend(1);
  const int64_t V = 7;
  const std::vector<std::vector<float>> rows = {
      {0.1f, 3.0f, -1.0f, 3.0f, 2.0f, 3.0f, 0.0f},
      {-INFINITY, -INFINITY, -INFINITY, 2.0f, -INFINITY, -INFINITY, 2.0f},
      {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, NAN},
      {9.0f, INFINITY, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
      std::vector<float>(7, -INFINITY),
      {-3.4028235e38f, -INFINITY, -3.4028235e38f, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
      {0.0f, -0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
      {-5.0f, -4.0f, -3.0f, -2.0f, -1.0f, -0.5f, -0.25f}};
  const int64_t R = int64_t(rows.size());
  std::vector<float> all;
  for (const auto& r : rows) all.insert(all.end(), r.begin(), r.end());
  std::vector<int32_t> want(static_cast<size_t>(R));
  be->argmax(mat(all.data(), DType::F32, R, V), want.data());
  EXPECT_EQ(want, (std::vector<int32_t>{1, 3, -1, -1, -1, 0, 0, 6}));
  int cuts = 0;
  for (int world = 1; world <= 4; ++world) {
    // Every way of cutting [0, V) into `world` non-empty ranges, as bits of the cut positions.
    for (uint32_t mask = 0; mask < (1u << (V - 1)); ++mask) {
      if (__builtin_popcount(mask) != world - 1) continue;
      std::vector<int64_t> from = {0};
      for (int64_t j = 1; j < V; ++j)
        if (mask & (1u << (j - 1))) from.push_back(j);
      from.push_back(V);
      std::vector<ArgmaxPart> parts(size_t(world * R));
      for (int w = 0; w < world; ++w)
        be->argmax_part(Mat{all.data() + from[size_t(w)], DType::F32, R, from[size_t(w) + 1] - from[size_t(w)], V},
                        from[size_t(w)], parts.data() + w * R);
      std::vector<int32_t> got(size_t(R), 77);
      be->argmax_merge(parts.data(), R, world, got.data());
      EXPECT_EQ(got, want) << "world " << world << " cuts " << mask;
      ++cuts;
    }
  }
  EXPECT_EQ(cuts, 1 + 6 + 15 + 20);
  // The parts say which case they are: a poisoned part, a part without a finite logit.
  ArgmaxPart p;
  be->argmax_part(Mat{all.data() + 2 * V + 4, DType::F32, 1, 3, V}, 4, &p);
  EXPECT_EQ(p.index, kPartPoisoned);
  be->argmax_part(Mat{all.data() + V, DType::F32, 1, 3, V}, 0, &p);
  EXPECT_EQ(p.index, kPartNoFinite);
  be->argmax_part(Mat{all.data() + V + 3, DType::F32, 1, 4, V}, 3, &p);
  EXPECT_EQ(p.index, 3);
  EXPECT_EQ(p.value, 2.0f);
}

// The sample op split over ranks (sample_part on each rank's columns, sample_merge of the gathered
// lists) against the sample op over the whole row: the same picks, the same marks, counts and draw
// counters, for settings the split takes (greedy, top_k 1..kSampleCandidates with top-p, min-p and the
// penalties on or off), rows with ties, a NaN or +inf logit, -inf columns and no finite logit, a
// vocabulary cut into 1..4 uneven ranges, over several draws; and a setting it does not take refused.
TEST(CpuSampleSplit, MergedCandidatesDrawWhatTheWholeRowDraws) {
  auto be = make_cpu_backend(1);
  ASSERT_TRUE(be->sample_split());
  const int64_t V = 1000, R = 6;
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(size_t(R * V));
  for (float& x : logits) x = nd(rng);
  for (int64_t j = 0; j < V; j += 7) logits[size_t(1 * V + j)] = 3.0f;  // row 1: many ties at the top
  logits[size_t(2 * V + 640)] = NAN;                                     // row 2: poisoned on one rank
  for (int64_t j = 0; j < V / 2; ++j) logits[size_t(3 * V + j)] = -INFINITY;  // row 3: -inf columns
  for (int64_t j = 0; j < V; ++j) logits[size_t(4 * V + j)] = -INFINITY;      // row 4: nothing finite
  logits[size_t(5 * V + 999)] = INFINITY;                                      // row 5: +inf
  const std::vector<SampleParams> settings = {
      {0.0f, 0, 1.0f, 0.0f, 1.0f, 1},           {0.8f, 1, 1.0f, 0.0f, 1.0f, 2},
      {0.8f, 40, 0.9f, 0.0f, 1.0f, 3},          {1.3f, 64, 1.0f, 0.05f, 1.0f, 4},
      {0.7f, 20, 0.5f, 0.1f, 1.3f, 5, 0.4f, 0.3f}, {2.0f, 7, 0.95f, 0.0f, 1.1f, 6, 0.0f, 1.0f}};
  int cases = 0;
  for (int world = 1; world <= 4; ++world) {
    // Uneven cuts: rank w starts at from[w].
    std::vector<int64_t> from = {0};
    for (int w = 1; w < world; ++w) from.push_back(V * w / world + (w % 2 ? 13 : -29));
    from.push_back(V);
    for (const SampleParams& sp : settings) {
      ASSERT_TRUE(sampling::split_draw_suits(sp));
      std::vector<SampleParams> params(size_t(R), sp);
      std::vector<uint8_t> seen_a(size_t(R * V)), seen_b;
      std::vector<int32_t> counts_a(size_t(R * V)), counts_b;
      for (size_t i = 0; i < seen_a.size(); i += 11) seen_a[i] = 1, counts_a[i] = int32_t(i % 3);
      seen_b = seen_a, counts_b = counts_a;
      std::vector<uint32_t> step_a(size_t(R), 5), step_b(size_t(R), 5);
      auto state = [&](std::vector<uint8_t>& seen, std::vector<int32_t>& counts, std::vector<uint32_t>& step) {
        SampleState st;
        st.params = params.data();
        st.step = step.data();
        st.seen = seen.data();
        st.seen_ld = V;
        st.counts = counts.data();
        st.counts_ld = V;
        return st;
      };
      for (int draw = 0; draw < 4; ++draw) {
        std::vector<int32_t> want(static_cast<size_t>(R)), got(static_cast<size_t>(R), 77);
        be->sample(mat(logits.data(), DType::F32, R, V), state(seen_a, counts_a, step_a), want.data());
        std::vector<SampleCandidate> parts(size_t(world * R * kSampleCandidates));
        const SampleState st = state(seen_b, counts_b, step_b);
        for (int w = 0; w < world; ++w)
          be->sample_part(Mat{logits.data() + from[size_t(w)], DType::F32, R, from[size_t(w) + 1] - from[size_t(w)], V},
                          from[size_t(w)], st, parts.data() + w * R * kSampleCandidates);
        be->sample_merge(parts.data(), R, world, st, got.data());
        EXPECT_EQ(got, want) << "world " << world << " temperature " << sp.temperature << " top_k " << sp.top_k
                             << " draw " << draw;
        EXPECT_EQ(want[2], sampling::kNoToken);
        EXPECT_EQ(want[4], sampling::kNoToken);
        EXPECT_EQ(want[5], sampling::kNoToken);
        ++cases;
      }
      EXPECT_EQ(seen_b, seen_a);
      EXPECT_EQ(counts_b, counts_a);
      EXPECT_EQ(step_b, step_a);
    }
  }
  EXPECT_EQ(cases, 4 * 6 * 4);
  // top_k 0 with a positive temperature needs the whole row: not split, and refused if merged.
  SampleParams whole{0.8f, 0, 0.9f};
  EXPECT_FALSE(sampling::split_draw_suits(whole));
  EXPECT_FALSE(sampling::split_draw_suits(SampleParams{0.8f, kSampleCandidates + 1}));
  std::vector<SampleCandidate> one(static_cast<size_t>(kSampleCandidates));
  uint32_t step = 0;
  SampleState st;
  st.params = &whole;
  st.step = &step;
  int32_t out = 0;
  be->sample_part(mat(logits.data(), DType::F32, 1, V), 0, st, one.data());
  EXPECT_THROW(be->sample_merge(one.data(), 1, 1, st, &out), Error);
}

TEST(CpuSampleOp, StateRowsSeenMarksAndDrawCounters) {
  auto be = make_cpu_backend(2);
  const int64_t V = 300, R = 3;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> logits(size_t(R * V));
  for (float& x : logits) x = nd(rng);
  // Logits row r uses state row state_of[r].
  const std::vector<int32_t> state_of = {2, 0, 1};
  std::vector<SampleParams> params(3);
  params[0] = SampleParams{0.7f, 40, 0.9f, 0.0f, 1.3f, 11};
  params[1] = SampleParams{0.0f, 0, 1.0f, 0.0f, 1.0f, 0};  // the argmax
  params[2] = SampleParams{1.2f, 0, 1.0f, 0.05f, 1.0f, 12};
  std::vector<uint32_t> step = {5, 0, 77};
  std::vector<uint8_t> seen(size_t(3 * V), 0);
  for (int i = 0; i < 40; ++i) seen[size_t(rng() % (3 * V))] = 1;
  const std::vector<uint32_t> step0 = step;
  const std::vector<uint8_t> seen0 = seen;
  SampleState st{state_of.data(), params.data(), step.data(), seen.data(), V};
  std::vector<int32_t> out(3);
  for (int call = 0; call < 3; ++call) {
    std::vector<uint8_t> seen_before = seen;
    be->sample(mat(logits.data(), DType::F32, R, V), st, out.data());
    for (int64_t r = 0; r < R; ++r) {
      const int32_t s = state_of[size_t(r)];
      const int32_t want = sampling::sample_row(logits.data() + r * V, V, params[size_t(s)],
                                                seen_before.data() + s * V, step0[size_t(s)] + uint32_t(call));
      EXPECT_EQ(out[size_t(r)], want) << "call " << call << " row " << r;
      EXPECT_EQ(seen[size_t(s * V + out[size_t(r)])], 1);
      EXPECT_EQ(step[size_t(s)], step0[size_t(s)] + uint32_t(call) + 1);
    }
  }
  // State row 1 takes the argmax of its logits row (2), lowest index on ties.
  const float* l2 = logits.data() + 2 * V;
  EXPECT_EQ(out[2], int32_t(std::max_element(l2, l2 + V) - l2));
  int marked = 0;
  for (size_t i = 0; i < seen.size(); ++i) marked += seen[i] != seen0[i];
  EXPECT_GE(marked, 3);
}

// One engine as two two-row models on separate CPU backends: `dev` decodes on the backend, `host`
// gives forward() logits for a host Sampler to pick from.
RuntimeOptions two_rows() {
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 40;
  return rt;
}
struct DevAndHost {
  Engine eng = build_engine(test::fixture("qwen3_swa"));
  std::unique_ptr<Backend> be_a = make_cpu_backend(2), be_b = make_cpu_backend(2);
  Model dev{eng, *be_a, two_rows()}, host{eng, *be_b, two_rows()};
};

// Two rows decode for several steps: row 0 samples with every filter and the penalty, row 1 takes the
// argmax. The same steps through forward() with a host Sampler give the same tokens.
TEST(ModelDecode, SamplesLikeAHostSamplerOverForward) {
  DevAndHost f;
  Model &dev = f.dev, &host = f.host;
  const int64_t V = dev.spec().vocab;
  SamplingParams sp;
  sp.temperature = 1.3f;
  sp.top_k = 200;
  sp.top_p = 0.97f;
  sp.min_p = 0.01f;
  sp.repetition_penalty = 1.5f;
  sp.seed = 2024;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 17, 230, 9}, {44, 3, 12}};
  Batch fill;
  for (int r = 0; r < 2; ++r) fill.rows.push_back(BatchRow{r, prompts[size_t(r)], 0, {}, false});
  HostTensor lg = dev.forward(fill);
  host.forward(fill);
  Sampler sampler(sp), greedy(SamplingParams{});
  std::vector<int32_t> history = prompts[0];
  std::vector<int32_t> tok = {sampler.pick(lg.as<float>(), V, history), greedy.pick(lg.as<float>() + V, V, {})};
  history.push_back(tok[0]);
  dev.set_sampling(0, sp, history, sampler.draws());
  std::vector<int64_t> at = {int64_t(prompts[0].size()), int64_t(prompts[1].size())};
  std::vector<int32_t> dev_tok = tok, host_tok = tok;
  std::set<int32_t> distinct;
  for (int step = 0; step < 12; ++step) {
    dev_tok = dev.decode({0, 1}, dev_tok, at);
    HostTensor l = host.forward(Batch{{BatchRow{0, {host_tok[0]}, at[0], {}, false},
                                       BatchRow{1, {host_tok[1]}, at[1], {}, false}}});
    host_tok = {sampler.pick(l.as<float>(), V, history), greedy.pick(l.as<float>() + V, V, {})};
    history.push_back(host_tok[0]);
    ASSERT_EQ(dev_tok, host_tok) << "step " << step;
    distinct.insert(dev_tok[0]);
    for (int64_t& a : at) ++a;
  }
  EXPECT_GT(distinct.size(), 1u);  // it did sample
  test::expect_error([&] { dev.set_sampling(2, sp); }, {"cache row 2", "outside [0, 2)"});
  test::expect_error([&] { dev.set_sampling(0, sp, std::vector<int32_t>{int32_t(V)}); }, {"outside the vocabulary"});
  SamplingParams bad = sp;
  bad.top_p = 2.0f;
  test::expect_error([&] { dev.set_sampling(0, bad); }, {"--top-p"});
}


// OpenAI's penalties: a token generated c times loses frequency * c + presence (c > 0), after the
// repetition penalty and before the temperature; the prompt is not counted.
TEST(Sampler, FrequencyAndPresencePenaltiesCountGeneratedTokens) {
  const std::vector<float> l = {2.0f, 1.5f, 1.0f};
  auto greedy_with = [&](float freq, float pres, std::vector<int32_t> counts, float rep = 1.0f,
                         std::vector<uint8_t> seen = {}) {
    SampleParams p;
    p.frequency_penalty = freq;
    p.presence_penalty = pres;
    p.repetition_penalty = rep;
    return sampling::sample_row(l.data(), 3, p, seen.empty() ? nullptr : seen.data(), counts.data(), 0);
  };
  EXPECT_EQ(greedy_with(0.0f, 0.0f, {5, 0, 0}), 0);  // off: counts change nothing
  EXPECT_EQ(greedy_with(0.6f, 0.0f, {1, 0, 0}), 1);  // 2 - 0.6 < 1.5
  EXPECT_EQ(greedy_with(0.3f, 0.0f, {1, 0, 0}), 0);  // 2 - 0.3 > 1.5
  EXPECT_EQ(greedy_with(0.3f, 0.0f, {2, 0, 0}), 1);  // 2 - 0.6: the count multiplies
  EXPECT_EQ(greedy_with(0.0f, 0.6f, {1, 0, 0}), 1);  // presence: once
  EXPECT_EQ(greedy_with(0.0f, 0.4f, {9, 0, 0}), 0);  // ... whatever the count
  EXPECT_EQ(greedy_with(0.0f, -1.2f, {0, 0, 1}), 2);  // negative: encouraged (1 + 1.2 > 2)
  EXPECT_EQ(greedy_with(0.2f, 0.2f, {1, 0, 0}), 0);  // 2 - 0.4 > 1.5
  EXPECT_EQ(greedy_with(0.2f, 0.2f, {2, 0, 0}), 1);  // 2 - 0.6 < 1.5
  // Order: the repetition penalty first (2 / 1.25 = 1.6), then the additive ones (1.6 - 0.2 < 1.5).
  EXPECT_EQ(greedy_with(0.0f, 0.0f, {1, 0, 0}, 1.25f, {1, 0, 0}), 0);
  EXPECT_EQ(greedy_with(0.2f, 0.0f, {1, 0, 0}, 1.25f, {1, 0, 0}), 1);
  // The score is the rounded sequence the definition names, bit for bit.
  // (volatile: each step rounded on its own, never contracted into an FMA)
  volatile float q = 2.0f / 1.25f, f = 0.1f * 3.0f;
  volatile float d = q - f;
  volatile float e = d - 0.3f;
  EXPECT_EQ(sampling::score(2.0f, true, 1.25f, 3, 0.1f, 0.3f, 0.5f), e * 0.5f);

  // The host Sampler counts `generated` (each occurrence), not the history.
  SamplingParams sp;
  sp.frequency_penalty = 0.3f;
  EXPECT_FALSE(sp.greedy());
  EXPECT_EQ(Sampler(sp).pick(l.data(), 3, {0, 0, 0, 0}), 0);  // a prompt full of token 0 is not counted
  EXPECT_EQ(Sampler(sp).pick(l.data(), 3, {0}, {0}), 0);
  EXPECT_EQ(Sampler(sp).pick(l.data(), 3, {0, 0}, {0, 0}), 1);
  // Sampled: the same draw as the op's reference over the same counts.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SamplingParams t = temp(0.8f, seed);
    t.presence_penalty = 1.5f;
    t.frequency_penalty = -0.5f;
    const std::vector<int32_t> counts = {0, 2, 1};
    EXPECT_EQ(Sampler(t).pick(l.data(), 3, {}, {1, 2, 1}),
              sampling::sample_row(l.data(), 3, t.to_backend(), nullptr, counts.data(), 0));
  }
}

TEST(Sampler, PenaltyRangesAreChecked) {
  for (float bad : {2.01f, -2.5f, NAN, INFINITY}) {
    SamplingParams f;
    f.frequency_penalty = bad;
    test::expect_error([&] { Sampler x(f); }, {"--frequency-penalty", "[-2, 2]"});
    SamplingParams p;
    p.presence_penalty = bad;
    test::expect_error([&] { Sampler x(p); }, {"--presence-penalty", "[-2, 2]"});
  }
  SamplingParams ok;
  ok.frequency_penalty = -2.0f;
  ok.presence_penalty = 2.0f;
  EXPECT_NO_THROW(Sampler{ok});
}

// The op counts its picks in the state row's counts (none for a row without a pick).
TEST(CpuSampleOp, CountsPicks) {
  auto be = make_cpu_backend(1);
  const std::vector<float> l = {2.0f, 1.5f, 1.0f, NAN, 0.0f, 0.0f};
  SampleParams p;
  p.frequency_penalty = 0.3f;
  uint32_t step = 0;
  std::vector<int32_t> counts(3, 0);
  SampleState st{nullptr, &p, &step, nullptr, 0, counts.data(), 3};
  std::vector<int32_t> picks;
  for (int i = 0; i < 4; ++i) {
    int32_t out = -2;
    be->sample(mat(const_cast<float*>(l.data()), DType::F32, 1, 3), st, &out);
    picks.push_back(out);
  }
  // 2.0 -> 1.7 -> 1.4 (< 1.5: token 1) -> 1.2 vs 1.4 (token 0 again at 1.4 vs 1.2).
  EXPECT_EQ(picks, (std::vector<int32_t>{0, 0, 1, 0}));
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 1, 0}));
  int32_t out = 0;
  be->sample(mat(const_cast<float*>(l.data() + 3), DType::F32, 1, 3), st, &out);
  EXPECT_EQ(out, sampling::kNoToken);
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 1, 0}));
  EXPECT_EQ(step, 5u);
}

// log_softmax of the raw logits and the top-N (descending, ties to the lower id).
TEST(Logprobs, ReferenceRow) {
  const std::vector<float> l = {1.0f, 3.0f, -INFINITY, 3.0f, 0.5f};
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  const float lse = float(std::log(z));
  float chosen = 0;
  int32_t ids[4];
  float top[4];
  sampling::logprobs_row(l.data(), 5, 4, 4, &chosen, ids, top);
  EXPECT_NEAR(chosen, 0.5f - lse, 1e-6);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{1, 3, 0, 4}));
  EXPECT_NEAR(top[0], 3.0f - lse, 1e-6);
  EXPECT_EQ(top[0], top[1]);
  EXPECT_NEAR(top[3], 0.5f - lse, 1e-6);
  // Probabilities sum to 1.
  double sum = 0;
  for (float x : l) sum += std::exp(double(x) - double(lse));
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // More alternatives than tokens: the rest are kNoToken; a chosen id outside the row is NaN.
  int32_t ids7[7];
  float top7[7];
  sampling::logprobs_row(l.data(), 5, -1, 7, &chosen, ids7, top7);
  EXPECT_TRUE(std::isnan(chosen));
  EXPECT_EQ(ids7[4], 2);  // the -inf token comes last
  EXPECT_EQ(top7[4], -INFINITY);
  EXPECT_EQ(ids7[5], sampling::kNoToken);
  EXPECT_EQ(ids7[6], sampling::kNoToken);
  // Large logits do not overflow: the sum is taken relative to the maximum.
  const std::vector<float> big = {1000.0f, 1000.0f};
  sampling::logprobs_row(big.data(), 2, 0, 0, &chosen, ids, top);
  EXPECT_NEAR(chosen, -std::log(2.0f), 1e-6);

  // The CPU op is the reference row by row.
  auto be = make_cpu_backend(1);
  std::vector<float> rows = l;
  rows.insert(rows.end(), {0.0f, 0.0f, 0.0f, 0.0f, 9.0f});
  const int32_t picked[2] = {1, 4};
  float lp[2];
  int32_t top_ids[6];
  float top_lp[6];
  be->logprobs(mat(rows.data(), DType::F32, 2, 5), picked, 3, lp, top_ids, top_lp);
  for (int r = 0; r < 2; ++r) {
    float c;
    int32_t want_ids[3];
    float want_lp[3];
    sampling::logprobs_row(rows.data() + r * 5, 5, picked[r], 3, &c, want_ids, want_lp);
    EXPECT_EQ(lp[r], c);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(top_ids[r * 3 + k], want_ids[k]);
      EXPECT_EQ(top_lp[r * 3 + k], want_lp[k]);
    }
  }
  test::expect_error([&] { be->logprobs(mat(rows.data(), DType::F32, 2, 5), picked, 21, lp, top_ids, top_lp); },
                     {"top_n 21"});
}

// Model::decode with the additive penalties (counts kept on the device, seeded by set_sampling's
// generated tokens) picks what a host Sampler picks over forward()'s logits; decode_logprobs gives
// the reference log-probabilities of those logits.
TEST(ModelDecode, PenaltiesAndLogprobsMatchTheHost) {
  DevAndHost f;
  Model &dev = f.dev, &host = f.host;
  const int64_t V = dev.spec().vocab;
  SamplingParams sp;  // greedy with penalties: the argmax after them
  sp.frequency_penalty = 1.5f;
  sp.presence_penalty = 0.5f;
  SamplingParams sampled = temp(0.9f, 77);
  sampled.frequency_penalty = 0.7f;
  sampled.presence_penalty = -0.3f;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 17, 230, 9}, {44, 3, 12}};
  Batch fill;
  for (int r = 0; r < 2; ++r) fill.rows.push_back(BatchRow{r, prompts[size_t(r)], 0, {}, false});
  HostTensor lg = dev.forward(fill);
  host.forward(fill);
  test::expect_error([&] { dev.decode_logprobs(2); }, {"no decode step"});
  Sampler s0(sp), s1(sampled);
  std::vector<std::vector<int32_t>> gen(2);
  std::vector<int32_t> tok = {s0.pick(lg.as<float>(), V, prompts[0]), s1.pick(lg.as<float>() + V, V, prompts[1])};
  for (int r = 0; r < 2; ++r) {
    gen[size_t(r)].push_back(tok[size_t(r)]);
    std::vector<int32_t> h = prompts[size_t(r)];
    h.push_back(tok[size_t(r)]);
    dev.set_sampling(r, r == 0 ? sp : sampled, h, (r == 0 ? s0 : s1).draws(), gen[size_t(r)]);
  }
  std::vector<int64_t> at = {int64_t(prompts[0].size()), int64_t(prompts[1].size())};
  std::vector<int32_t> dev_tok = tok, host_tok = tok;
  std::set<int32_t> distinct;
  for (int step = 0; step < 10; ++step) {
    dev_tok = dev.decode({0, 1}, dev_tok, at);
    const Model::StepLogprobs lps = dev.decode_logprobs(3);
    HostTensor l = host.forward(Batch{{BatchRow{0, {host_tok[0]}, at[0], {}, false},
                                       BatchRow{1, {host_tok[1]}, at[1], {}, false}}});
    host_tok = {s0.pick(l.as<float>(), V, {}, gen[0]), s1.pick(l.as<float>() + V, V, {}, gen[1])};
    ASSERT_EQ(dev_tok, host_tok) << "step " << step;
    for (int r = 0; r < 2; ++r) {
      gen[size_t(r)].push_back(host_tok[size_t(r)]);
      float c;
      int32_t ids[3];
      float vals[3];
      sampling::logprobs_row(l.as<float>() + r * V, V, host_tok[size_t(r)], 3, &c, ids, vals);
      EXPECT_EQ(lps.chosen[size_t(r)], c);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(lps.top_ids[size_t(r * 3 + k)], ids[k]);
        EXPECT_EQ(lps.top[size_t(r * 3 + k)], vals[k]);
      }
    }
    distinct.insert(dev_tok[0]);
    for (int64_t& a : at) ++a;
  }
  // The penalties keep greedy from repeating one token forever.
  EXPECT_GT(distinct.size(), 2u);
  test::expect_error([&] { dev.set_sampling(0, sp, {}, 0, std::vector<int32_t>{int32_t(V)}); },
                     {"generated token id", "outside the vocabulary"});
}

}  // namespace
}  // namespace ingot
