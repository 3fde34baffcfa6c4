// The end-to-end reference check the parity tests share: one engine on the CPU backend against a
// transformers reference, every mode of run_reference_check (full prefill, token-by-token decode,
// random chunk splits, batched rows, greedy continuation) for each seed, within the fp32 tolerances
// (atol 1e-4, rtol 1e-4), greedy ids all agreeing, NaN never passing.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend/backend.h"
#include "runtime/model.h"
#include "runtime/reference_check.h"

namespace ingot::test {

inline void expect_reference_parity(const Engine& eng, const Reference& ref, CacheLayout layout, const std::string& name,
                                    std::initializer_list<uint64_t> seeds) {
  auto be = make_cpu_backend();
  RuntimeOptions rt;
  rt.max_batch = int(ref.rows());
  rt.capacity = reference_capacity(ref);
  rt.layout = layout;
  Model m(eng, *be, rt);
  CheckOptions co;  // atol 1e-4, rtol 1e-4
  for (uint64_t seed : seeds) {
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

}  // namespace ingot::test
