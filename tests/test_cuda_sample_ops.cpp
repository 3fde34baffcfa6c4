// Op-level conformance of the CUDA backend's sample and logprobs ops against the CPU reference
// (backend/sampling.h, backend/logprobs.h): the picks are the CPU's tokens exactly, over a Qwen-sized and
// a tiny vocabulary, every setting, every launch shape, and graph replay. Skips without a GPU.
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

}  // namespace
}  // namespace ingot
#else
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
