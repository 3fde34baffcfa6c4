// The static cache contract: rows outside a call keep their bytes, the capacity boundary is exact,
// a query with no visible key gives zeros, explicit positions mean what they say, and the decode step
// agrees with forward().
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "test_helpers.h"

namespace ingot {
namespace {

struct Fx {
  Engine eng = build_engine(test::fixture("qwen3_swa"));
  std::unique_ptr<Backend> be = make_cpu_backend();
};

std::vector<int32_t> seq(int n, int start = 3) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((start + 37 * i) % 500));
  return v;
}

TEST(KvCache, RowsOutsideACallAreUntouched) {
  Fx f;
  RuntimeOptions rt;
  rt.max_batch = 4;
  rt.capacity = 32;
  Model m(f.eng, *f.be, rt);
  Batch fill;
  for (int r = 0; r < 4; ++r) fill.rows.push_back(BatchRow{r, seq(10 + r, r), 0, {}, false});
  m.forward(fill);
  std::vector<std::vector<uint8_t>> before;
  for (int r = 0; r < 4; ++r) before.push_back(m.state().read_row(r));
  // Touch rows 1 and 2 only, at different write indices and chunk lengths.
  m.forward(Batch{{BatchRow{1, seq(3, 9), 11, {}, true}, BatchRow{2, seq(1, 4), 12, {}, false}}});
  EXPECT_EQ(m.state().read_row(0), before[0]);
  EXPECT_EQ(m.state().read_row(3), before[3]);
  EXPECT_NE(m.state().read_row(1), before[1]);
  EXPECT_NE(m.state().read_row(2), before[2]);
}

TEST(KvCache, CapacityBoundaryIsExact) {
  Fx f;
  RuntimeOptions rt;
  rt.capacity = 20;
  Model m(f.eng, *f.be, rt);
  Generator g(m);
  auto request = [](std::vector<int32_t> prompt, int max_new) {
    Request q;
    q.prompt = std::move(prompt);
    q.max_new_tokens = max_new;
    return q;
  };
  // prompt 12 + 9 new - 1 = 20 slots: exactly full is accepted.
  EXPECT_EQ(g.generate(request(seq(12), 9)).ids.size(), 9u);
  // One more token needs 21 slots: rejected before any compute, cache untouched.
  const std::vector<uint8_t> before = m.state().read_row(0);
  test::expect_error([&] { g.generate(request(seq(12, 7), 10)); }, {"21 cache slots", "capacity is 20"});
  EXPECT_EQ(m.state().read_row(0), before);
  // The same rule at the forward level.
  EXPECT_NO_THROW(m.forward(Batch{{BatchRow{0, seq(4), 16, {}, false}}}));
  test::expect_error([&] { m.forward(Batch{{BatchRow{0, seq(5), 16, {}, false}}}); }, {"capacity is 20"});
}

TEST(KvCache, MalformedCallsAreRejected) {
  Fx f;
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 16;
  Model m(f.eng, *f.be, rt);
  test::expect_error([&] { m.forward(Batch{}); }, {"no rows"});
  test::expect_error([&] { m.forward(Batch{{BatchRow{2, seq(1), 0, {}, false}}}); }, {"outside [0, 2)"});
  test::expect_error([&] { m.forward(Batch{{BatchRow{0, seq(1), 0, {}, false}, BatchRow{0, seq(1), 1, {}, false}}}); },
                     {"appears twice"});
  test::expect_error([&] { m.forward(Batch{{BatchRow{0, {}, 0, {}, false}}}); }, {"empty token chunk"});
  test::expect_error([&] { m.forward(Batch{{BatchRow{0, {99999}, 0, {}, false}}}); }, {"99999", "vocabulary"});
  test::expect_error([&] { m.forward(Batch{{BatchRow{0, seq(2), 0, {5}, false}}}); }, {"positions"});
}

TEST(KvCache, ExplicitPositionsEqualSlotsByDefault) {
  Fx f;
  RuntimeOptions rt;
  rt.capacity = 16;
  Model m(f.eng, *f.be, rt);
  HostTensor a = m.forward(Batch{{BatchRow{0, seq(6), 0, {}, true}}});
  HostTensor b = m.forward(Batch{{BatchRow{0, seq(6), 0, {0, 1, 2, 3, 4, 5}, true}}});
  HostTensor c = m.forward(Batch{{BatchRow{0, seq(6), 0, {10, 11, 12, 13, 14, 15}, true}}});
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.nbytes()), 0);  // RoPE positions do reach the model
}

TEST(KvCache, DecodeStepMatchesForward) {
  Fx f;
  RuntimeOptions rt;
  rt.max_batch = 3;
  rt.capacity = 24;
  Model m(f.eng, *f.be, rt);
  Batch fill;
  for (int r = 0; r < 3; ++r) fill.rows.push_back(BatchRow{r, seq(5 + 2 * r, r), 0, {}, false});
  HostTensor lg = m.forward(fill);
  std::vector<int32_t> tok;
  for (int r = 0; r < 3; ++r) {
    const float* l = lg.as<float>() + r * lg.shape()[1];
    tok.push_back(int32_t(std::max_element(l, l + lg.shape()[1]) - l));
  }
  std::vector<int32_t> next = m.decode({0, 1, 2}, tok, {5, 7, 9});
  HostTensor ref = m.forward(Batch{{BatchRow{0, {tok[0]}, 5, {}, false}, BatchRow{1, {tok[1]}, 7, {}, false},
                                    BatchRow{2, {tok[2]}, 9, {}, false}}});
  for (int r = 0; r < 3; ++r) {
    const float* l = ref.as<float>() + r * ref.shape()[1];
    EXPECT_EQ(next[size_t(r)], int32_t(std::max_element(l, l + ref.shape()[1]) - l));
  }
}

// The op itself: a query whose row has no visible key (valid length 0) yields zeros, never NaN, and
// the window excludes keys at slot <= p - window.
// The ranking the CUDA decode attention starts its blocks by (TokenMeta::order): longest kv_len first,
// ties by index; -1 first when every row has one length (launch order); empty for no rows.
TEST(AttentionOp, LongestFirstOrderRanksByLengthThenIndex) {
  EXPECT_EQ(longest_first_order({5, 9, 5, 0, 9, 7}), (std::vector<int32_t>{1, 4, 5, 0, 2, 3}));
  EXPECT_EQ(longest_first_order({1, 2, 3}), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(longest_first_order({4, 4, 4}), (std::vector<int32_t>{-1, 1, 2}));
  EXPECT_EQ(longest_first_order({8}), (std::vector<int32_t>{-1}));
  EXPECT_TRUE(longest_first_order({}).empty());
}

TEST(AttentionOp, AllMaskedRowGivesZerosAndWindowIsExact) {
  auto be = make_cpu_backend(1);
  const int D = 4, cap = 8;
  std::vector<float> k(size_t(cap * D)), v(size_t(cap * D)), q(size_t(2 * D), 1.0f), out(size_t(2 * D), 7.0f);
  for (int j = 0; j < cap; ++j)
    for (int i = 0; i < D; ++i) {
      k[size_t(j * D + i)] = 0.1f * float(j);
      v[size_t(j * D + i)] = float(j);  // value = its slot, so the output reveals which keys were used
    }
  std::vector<int32_t> row{0, 0}, slot{5, 5}, kv_len{0, 6};
  AttentionParams p;
  p.q = mat(q.data(), DType::F32, 2, D);
  p.out = mat(out.data(), DType::F32, 2, D);
  p.q_heads = p.kv_heads = 1;
  p.head_dim = D;
  p.window = 1;  // only the key at the query's own slot
  p.scale = 0.5f;
  p.meta = {row.data(), slot.data(), slot.data(), kv_len.data()};
  p.cache = {k.data(), v.data(), DType::F32, cap * D, cap * D, D, cap};
  be->attention(p);
  for (int i = 0; i < D; ++i) {
    EXPECT_EQ(out[size_t(i)], 0.0f);                // all masked
    EXPECT_FLOAT_EQ(out[size_t(D + i)], 5.0f);      // window 1: slot 5 alone
  }
}

}  // namespace
}  // namespace ingot
