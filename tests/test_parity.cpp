// End-to-end parity with transformers on every committed fixture (CPU backend, f32): full prefill,
// token-by-token decode, random chunk splits, batched rows at different write indices and the greedy
// continuation, in both cache layouts, all within allclose(1e-4, 1e-4).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "runtime/reference_check.h"
#include "test_helpers.h"

namespace ingot {
namespace {

class Parity : public ::testing::TestWithParam<std::tuple<std::string, CacheLayout>> {};

TEST_P(Parity, MatchesTransformers) {
  const auto& [name, layout] = GetParam();
  const std::string dir = test::fixture(name);
  Reference ref = load_reference(dir + "/reference.safetensors");
  Engine eng = build_engine(dir);
  auto be = make_cpu_backend();
  RuntimeOptions rt;
  rt.max_batch = int(ref.rows());
  rt.capacity = reference_capacity(ref);
  rt.layout = layout;
  Model m(eng, *be, rt);
  CheckOptions co;  // atol 1e-4, rtol 1e-4
  for (uint64_t seed : {1u, 2u, 3u}) {
    co.seed = seed;
    for (const CaseResult& c : run_reference_check(m, ref, co)) {
      SCOPED_TRACE(name + " " + c.mode + " seed " + std::to_string(seed));
      EXPECT_FALSE(std::isnan(c.max_abs));
      EXPECT_TRUE(c.allclose) << "max |dlogit| " << c.max_abs;
      EXPECT_EQ(c.agree, c.total);
      EXPECT_GT(c.total, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity,
                         ::testing::Combine(::testing::Values("llama3", "qwen2", "qwen3", "qwen3_swa"),
                                            ::testing::Values(CacheLayout::HeadsFirst, CacheLayout::Flattened)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + layout_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ingot
