// Ranks as processes driven by rank 0 (Model::lead_ranks, runtime/tp_lead.h), on the CPU: the calls'
// wire form read back as written and refused when cut short; and a real group of two processes (rank 0
// re-executes this test binary for rank 1 with --gtest_filter naming the test) where rank 0 leads:
// its picks equal one rank's, a call refused on rank 0 is refused on the other too and the group goes
// on, and the follower returns once rank 0's Model is gone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/process_group.h"
#include "dist/process_io.h"
#include "io/engine.h"
#include "runtime/model.h"
#include "runtime/tp_group.h"
#include "runtime/tp_lead.h"
#include "test_helpers.h"

namespace ingot {
namespace {

using tp_call::Call;

TEST(TpLeadWire, CallsReadBackAsWritten) {
  Batch b;
  b.rows.push_back(BatchRow{1, {5, 6, 7}, 3, {10, 11, 12}, true, true});
  b.rows.push_back(BatchRow{0, {9}, 0, {}, false, false});
  {
    const std::vector<uint8_t> msg = tp_call::launch_forward(b, {-1, 0});
    tp_call::Reader r(msg);
    EXPECT_FALSE(r.leader_failed());
    EXPECT_EQ(r.call(), Call::LaunchForward);
    const Batch got = r.batch();
    ASSERT_EQ(got.rows.size(), 2u);
    EXPECT_EQ(got.rows[0].row, 1);
    EXPECT_EQ(got.rows[0].tokens, (std::vector<int32_t>{5, 6, 7}));
    EXPECT_EQ(got.rows[0].write_index, 3);
    EXPECT_EQ(got.rows[0].positions, (std::vector<int64_t>{10, 11, 12}));
    EXPECT_TRUE(got.rows[0].all_logits);
    EXPECT_FALSE(got.rows[1].wants_output);
    EXPECT_EQ(r.ints(), (std::vector<int32_t>{-1, 0}));
    EXPECT_NO_THROW(r.end());
  }
  {
    SamplingParams p;
    p.temperature = 0.7f;
    p.top_k = 40;
    p.seed = 1234567890123ull;
    p.presence_penalty = 0.5f;
    const std::vector<int32_t> history = {1, 2, 3}, generated = {3};
    const std::vector<uint8_t> msg = tp_call::set_sampling(1, p, history, 7, generated);
    tp_call::Reader r(msg);
    r.leader_failed();
    EXPECT_EQ(r.call(), Call::SetSampling);
    EXPECT_EQ(r.i32(), 1);
    EXPECT_EQ(r.sampling(), p);
    EXPECT_EQ(r.ints(), history);
    EXPECT_EQ(r.u32(), 7u);
    EXPECT_EQ(r.ints(), generated);
    EXPECT_NO_THROW(r.end());
  }
  {
    const std::vector<uint8_t> msg = tp_call::launch_decode({0, 1}, {4, 5}, {8, 9}, {});
    tp_call::Reader r(msg);
    r.leader_failed();
    EXPECT_EQ(r.call(), Call::LaunchDecode);
    EXPECT_EQ(r.ints(), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(r.ints(), (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(r.longs(), (std::vector<int64_t>{8, 9}));
    EXPECT_TRUE(r.ints().empty());
    EXPECT_NO_THROW(r.end());
  }
  {
    const std::vector<uint8_t> msg = tp_call::decode_logprobs(5);
    tp_call::Reader r(msg);
    r.leader_failed();
    EXPECT_EQ(r.call(), Call::DecodeLogprobs);
    EXPECT_EQ(r.i32(), 5);
    EXPECT_NO_THROW(r.end());
  }
}

TEST(TpLeadWire, RefusesMessagesCutShortOrTooLong) {
  Batch b;
  b.rows.push_back(BatchRow{0, {1, 2, 3, 4}, 0, {}, false, true});
  const std::vector<uint8_t> whole = tp_call::forward(Call::Forward, b);
  // Every prefix is refused while its fields are read, never read past.
  for (size_t n = 2; n < whole.size(); ++n) {
    const std::vector<uint8_t> cut(whole.begin(), whole.begin() + long(n));
    tp_call::Reader r(cut);
    r.leader_failed();
    r.call();
    EXPECT_THROW((r.batch(), r.end()), tp_call::WireError) << n;
  }
  std::vector<uint8_t> longer = whole;
  longer.push_back(0);
  tp_call::Reader r(longer);
  r.leader_failed();
  r.call();
  r.batch();
  EXPECT_THROW(r.end(), tp_call::WireError);
  // A count that claims more values than the message holds.
  std::vector<uint8_t> huge = tp_call::launch_decode({0}, {1}, {0}, {});
  huge[2] = 0xff, huge[9] = 0x7f;
  tp_call::Reader h(huge);
  h.leader_failed();
  h.call();
  EXPECT_THROW(h.ints(), tp_call::WireError);
  const std::vector<uint8_t> unknown = {0, 99};
  tp_call::Reader u(unknown);
  u.leader_failed();
  EXPECT_THROW(u.call(), tp_call::WireError);
}

std::string current_test() {
  const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(t->test_suite_name()) + "." + t->name();
}

TEST(TpLeadProcesses, Rank0LeadsAndTheOtherFollows) {
  ProcessGroupOptions po;
  po.world = 2;
  po.argv = {proc::self_executable(), "--gtest_filter=" + current_test()};
  po.silence_worker_stdout = false;  // a worker's failed expectation shows in the test's log
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::shared_ptr<RankProcess> ranks = RankProcess::start(po, *be);
  const int rank = ranks->rank();
  Engine engine = build_engine(test::fixture("qwen3"), BuildOptions{DType::F32});
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 256;
  rt.tp = 2;
  bool led = false;
  {
    Model m(engine, *be, rt, ranks);
    led = m.lead_ranks();
    EXPECT_EQ(led, rank == 0);
    if (led) {
      // One rank, in this process alone, for the expected picks.
      RuntimeOptions one = rt;
      one.tp = 1;
      Model solo(engine, *be, one);
      Batch bad;
      bad.rows.push_back(BatchRow{5, {1, 2}, 0, {}, false});  // cache row 5 of 2: refused on every rank
      EXPECT_THROW(m.forward(bad), Error);
      EXPECT_THROW(m.finish_launch(), Error);  // nothing launched: refused on every rank
      Batch prompt;
      prompt.rows.push_back(BatchRow{0, {1, 2, 3, 4, 5}, 0, {}, false});
      prompt.rows.push_back(BatchRow{1, {9, 8, 7}, 0, {}, false});
      const HostTensor a = m.forward(prompt), b = solo.forward(prompt);
      ASSERT_EQ(a.numel(), b.numel());
      for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.as<float>()[i], b.as<float>()[i], 1e-4f) << i;
      SamplingParams sp;
      sp.temperature = 0.8f;
      sp.seed = 42;
      m.set_sampling(1, sp);
      solo.set_sampling(1, sp);
      std::vector<int32_t> tm = {3, 4}, ts = {3, 4};
      std::vector<int64_t> at = {5, 3};
      for (int step = 0; step < 8; ++step) {
        tm = m.decode({0, 1}, tm, at);
        ts = solo.decode({0, 1}, ts, at);
        EXPECT_EQ(tm, ts) << "step " << step;
        for (int32_t& t : tm) t = t < 0 ? 0 : t;
        for (int32_t& t : ts) t = t < 0 ? 0 : t;
        for (int64_t& i : at) ++i;
      }
      // A greedy step picks from each rank's share of the vocabulary (no logits gathered); its
      // log-probabilities gather them, on both ranks, to what one rank gives.
      {
        const std::vector<int32_t> pm = m.decode({0}, {tm[0]}, {at[0]}), ps = solo.decode({0}, {ts[0]}, {at[0]});
        EXPECT_EQ(pm, ps);
        const Model::StepLogprobs lm = m.decode_logprobs(3), ls = solo.decode_logprobs(3);
        EXPECT_EQ(lm.top_ids, ls.top_ids);
        ASSERT_EQ(lm.chosen.size(), 1u);
        EXPECT_NEAR(lm.chosen[0], ls.chosen[0], 1e-4f);
        ++at[0];
      }
      // A call longer than the broadcast's first slot (tp_lead.h: 1016 bytes): a 200-token prompt with
      // explicit positions, in a row of its own.
      Batch longer;
      BatchRow big{0, {}, 0, {}, false};
      for (int i = 0; i < 200; ++i) {
        big.tokens.push_back(int32_t(1 + i % 300));
        big.positions.push_back(i);
      }
      longer.rows.push_back(big);
      Model solo2(engine, *be, one);
      const HostTensor la = m.forward(longer), lb = solo2.forward(longer);
      ASSERT_EQ(la.numel(), lb.numel());
      for (int64_t i = 0; i < la.numel(); ++i) EXPECT_NEAR(la.as<float>()[i], lb.as<float>()[i], 1e-4f) << i;
      // Two launched steps, the second fed the first's picks on the device.
      m.launch_decode({0, 1}, tm, at);
      for (int64_t& i : at) ++i;
      m.launch_decode({0, 1}, tm, at, {0, 1});
      EXPECT_EQ(m.outstanding(), 2);
      m.finish_launch();
      m.finish_launch();
    }
  }
  // Both ranks here: the group still stands after the Model's calls and its End.
  std::vector<int32_t> seen(2, 0);
  seen[size_t(rank)] = led ? 1 : 2;
  ranks->group().comm().all_gather(&seen[size_t(rank)], seen.data(), sizeof(int32_t));
  EXPECT_EQ(seen, (std::vector<int32_t>{1, 2}));
  const std::vector<ProcessGroup::Ended> ends = ranks->close();
  if (rank == 0)
    for (const auto& e : ends) EXPECT_TRUE(e.clean) << "rank " << e.rank << " " << e.how;
}

}  // namespace
}  // namespace ingot
