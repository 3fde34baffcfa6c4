// Tensor parallelism on the GPU (docs/tensor-parallel.md, "On the GPU"): one process per GPU, NCCL
// between them. Every test needs at least 2 GPUs and skips, saying so, with fewer (and without a CUDA
// build with NCCL). Through the command line (the `ingot` staged next to this binary, or the one built
// with it): `ingot check --tp 2 --device cuda --dtype fp32` passes on every fixture, and greedy bf16
// tokens at --tp 2 equal --tp 1's, an engine directory runs as the checkpoint split at load, and chat led by rank 0 answers as one GPU. In this process (SPMD as the CLI is: rank 0 re-executes this test
// binary for rank 1 with --gtest_filter naming the test): both ranks' logits bitwise equal, from the
// prefill and from graph-captured decode steps (which hold the NCCL calls), in f32 and bf16.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "dist/in_process.h"  // GroupStopped
#include "dist/p2p_all_reduce.h"
#include "dist/process_group.h"
#include "dist/reduce.h"
#include "dist/process_io.h"
#include "io/engine.h"
#include "runtime/model.h"
#include "runtime/tp_group.h"
#include "test_helpers.h"

#if defined(INGOT_WITH_CUDA) && defined(INGOT_WITH_NCCL)
namespace ingot {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kFixtures = {"llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"};

// INGOT_SOURCE_DIR in the environment wins, so binaries built here run from the GPU machine's copy.
std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("INGOT_SOURCE_DIR");
  return std::string(env && *env ? env : INGOT_SOURCE_DIR) + "/tests/data/models/" + name;
}

// The `ingot` beside this binary (scripts/gpu-build stages them together), else the one built with it.
std::string ingot_binary() {
  const fs::path here = fs::path(proc::self_executable()).parent_path() / "ingot";
  return fs::exists(here) ? here.string() : std::string(INGOT_BINARY);
}

class CudaTp : public ::testing::Test {
 protected:
  void SetUp() override {
    const int n = cuda_device_count();
    if (n < 2) GTEST_SKIP() << "tensor parallelism on the GPU needs 2 GPUs; this machine has " << n;
  }
};

TEST_F(CudaTp, CheckPassesOnEveryFixtureInF32) {
  for (const std::string& f : kFixtures) {
    const std::string dir = fixture_dir(f);
    const auto [rc, out] = test::sh(test::q(ingot_binary()) + " check --tp 2 --device cuda --dtype fp32 --model " +
                                    test::q(dir) + " --reference " + test::q(dir + "/reference.safetensors"));
    EXPECT_EQ(rc, 0) << f << ":\n" << out;
    EXPECT_NE(out.find("check passed"), std::string::npos) << f << ":\n" << out;
  }
}

TEST_F(CudaTp, GreedyBf16TokensEqualOneRank) {
  for (const std::string& f : kFixtures) {
    const std::string gen = test::q(ingot_binary()) + " generate --device cuda --dtype bf16 --model " +
                            test::q(fixture_dir(f)) + " --prompt-ids 1,2,3,4,5 --max-new-tokens 32";
    const auto [rc1, one] = test::sh(gen);
    const auto [rc2, two] = test::sh(gen + " --tp 2");
    EXPECT_EQ(rc1, 0) << f << ":\n" << one;
    EXPECT_EQ(rc2, 0) << f << ":\n" << two;
    EXPECT_NE(two.find("generated 32 tokens"), std::string::npos) << f << ":\n" << two;
    EXPECT_EQ(two, one) << f;
  }
}

// An engine directory (`ingot build --tp 2 -o DIR`) on the GPU: each rank process loads its own rank's
// file; the greedy bf16 tokens equal those of the checkpoint split at load, and a rank file that does not
// verify is refused naming it.
TEST_F(CudaTp, EngineDirectoryEqualsTheCheckpointSplitAtLoad) {
  const std::string dir = ::testing::TempDir() + "ingot_cuda_tp_engine";
  fs::remove_all(dir);
  for (const std::string& f : {std::string("qwen3"), std::string("llama3"), std::string("qwen3_5_text")}) {
    fs::remove_all(dir);
    const auto [rcb, built] = test::sh(test::q(ingot_binary()) + " build --tp 2 --dtype bf16 --model " +
                                       test::q(fixture_dir(f)) + " -o " + test::q(dir));
    ASSERT_EQ(rcb, 0) << f << ":\n" << built;
    const std::string tail = " --prompt-ids 1,2,3,4,5 --max-new-tokens 32 --ignore-eos --device cuda";
    const auto [rc1, from_dir] = test::sh(test::q(ingot_binary()) + " generate --engine " + test::q(dir) + tail);
    const auto [rc2, split] = test::sh(test::q(ingot_binary()) + " generate --tp 2 --dtype bf16 --model " +
                                       test::q(fixture_dir(f)) + tail);
    EXPECT_EQ(rc1, 0) << f << ":\n" << from_dir;
    EXPECT_EQ(rc2, 0) << f << ":\n" << split;
    EXPECT_NE(from_dir.find("generated 32 tokens"), std::string::npos) << f << ":\n" << from_dir;
    EXPECT_EQ(from_dir, split) << f;
  }
  {
    std::fstream file(dir + "/rank-1.ingot", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-10, std::ios::end);
    file.put('Z');
  }
  const auto [rc, out] = test::sh(test::q(ingot_binary()) + " generate --engine " + test::q(dir) +
                                  " --prompt-ids 1,2,3 --device cuda");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("rank-1.ingot: the file hashes to xxh64"), std::string::npos) << out;
  fs::remove_all(dir);
}

// chat at --tp 2 on the GPU: rank 0 reads the terminal and leads the other process (Model::lead_ranks);
// the replies (several turns and a /reset) equal one GPU's. The qwen3 fixture with the byte-level test
// tokenizer and its chat template (tests/data/api).
TEST_F(CudaTp, ChatLedByRank0EqualsOneGpu) {
  const std::string model = ::testing::TempDir() + "ingot_cuda_tp_chat_model";
  fs::remove_all(model);
  fs::create_directories(model);
  for (const auto& e : fs::directory_iterator(fixture_dir("qwen3")))
    if (e.path().filename() != "reference.safetensors") fs::copy(e.path(), model + "/" + e.path().filename().string());
  const std::string src = fs::path(fixture_dir("qwen3")).parent_path().parent_path().string() + "/api/";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy(src + f, model + "/" + f);
  const std::string chat = "printf 'Hi\\nHow are you\\n/reset\\nHi\\n' | " + test::q(ingot_binary()) +
                           " chat --device cuda --dtype fp32 --capacity 64 --max-new-tokens 8 --no-stats --model " +
                           test::q(model);
  const auto [rc1, one] = test::sh(chat);
  const auto [rc2, two] = test::sh(chat + " --tp 2");
  EXPECT_EQ(rc1, 0) << one;
  EXPECT_EQ(rc2, 0) << two;
  EXPECT_NE(one.find("[conversation reset]"), std::string::npos) << one;
  EXPECT_EQ(two, one);
  fs::remove_all(model);
}

TEST_F(CudaTp, RefusesMoreRanksThanGpus) {
  const int n = cuda_device_count();
  const std::string tp = std::to_string(n + 1);
  const auto [rc, out] = test::sh(test::q(ingot_binary()) + " generate --device cuda --tp " + tp + " --model " +
                                  test::q(fixture_dir("qwen3")) + " --prompt-ids 1,2,3");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--tp " + tp + " --device cuda needs " + tp + " GPUs"), std::string::npos) << out;
  EXPECT_NE(out.find("this machine has " + std::to_string(n)), std::string::npos) << out;
}

std::string current_test() {
  const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(t->test_suite_name()) + "." + t->name();
}

// Rank 0's bytes of `mine` against every rank's, through the host group (an all-gather of each rank's
// bytes): true when every rank holds the same bits.
bool same_on_every_rank(RankProcess& ranks, const void* mine, size_t bytes) {
  const int world = ranks.world(), rank = ranks.rank();
  std::vector<uint8_t> all(bytes * size_t(world));
  std::memcpy(all.data() + bytes * size_t(rank), mine, bytes);
  ranks.group().comm().all_gather(all.data() + bytes * size_t(rank), all.data(), bytes);
  for (int r = 1; r < world; ++r)
    if (std::memcmp(all.data(), all.data() + bytes * size_t(r), bytes) != 0) return false;
  return true;
}

// Every fixture at --tp 2 in this process and its peer: the prefill logits of every token bitwise
// equal on both ranks, then greedy decode steps (graph-captured, so the NCCL calls replay from the
// graph) giving the same tokens and the same log-probabilities, bitwise, on both ranks.
void ranks_agree(DType dt) {
  ProcessGroupOptions po;
  po.world = 2;
  po.argv = {proc::self_executable(), "--gtest_filter=" + current_test()};
  po.silence_worker_stdout = false;  // a worker's failed expectation shows in the test's log
  auto be = make_cuda_backend(dt, local_rank_from_environment() % cuda_device_count());
  std::shared_ptr<RankProcess> ranks = RankProcess::start(po, *be);
  const int rank = ranks->rank();
  for (const std::string& f : kFixtures) {
    Engine engine = build_engine(fixture_dir(f), BuildOptions{dt});
    RuntimeOptions rt;
    rt.max_batch = 2;
    rt.capacity = 64;
    rt.tp = 2;
    Model m(engine, *be, rt, ranks);
    Batch b;
    b.rows.push_back(BatchRow{0, {1, 2, 3, 4, 5, 6, 7}, 0, {}, true});
    b.rows.push_back(BatchRow{1, {9, 8, 7}, 0, {}, true});
    const HostTensor logits = m.forward(b);
    EXPECT_TRUE(same_on_every_rank(*ranks, logits.data(), logits.nbytes())) << f << " " << dtype_name(dt) << " prefill";
    std::vector<int32_t> tokens = {3, 4};
    std::vector<int64_t> at = {7, 3};
    for (int step = 0; step < 6; ++step) {
      tokens = m.decode({0, 1}, tokens, at);
      const Model::StepLogprobs lp = m.decode_logprobs(0);
      EXPECT_TRUE(same_on_every_rank(*ranks, tokens.data(), tokens.size() * sizeof(int32_t)))
          << f << " " << dtype_name(dt) << " step " << step << " tokens";
      EXPECT_TRUE(same_on_every_rank(*ranks, lp.chosen.data(), lp.chosen.size() * sizeof(float)))
          << f << " " << dtype_name(dt) << " step " << step << " log-probabilities";
      for (int32_t& t : tokens) t = t < 0 ? 0 : t;  // a non-token pick is not fed back
      for (int64_t& i : at) ++i;
    }
  }
  const std::vector<ProcessGroup::Ended> ends = ranks->close();
  if (rank == 0)
    for (const auto& e : ends) EXPECT_TRUE(e.clean) << "rank " << e.rank << " " << e.how;
}

TEST_F(CudaTp, RanksLogitsBitwiseEqualInF32) { ranks_agree(DType::F32); }
TEST_F(CudaTp, RanksLogitsBitwiseEqualInBf16) { ranks_agree(DType::BF16); }

// Rank r's addend: values of mixed signs and magnitudes (so 16-bit sums round and the order of the
// additions shows), different on every rank.
std::vector<float> addend(int rank, int64_t count, uint32_t salt) {
  std::vector<float> v(static_cast<size_t>(count));
  uint32_t x = 2463534242u ^ (uint32_t(rank) * 2654435761u) ^ salt;
  for (float& f : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    f = (float(x % 20001) - 10000.f) * (x & 1 ? 1e-3f : 0.37f);
  }
  return v;
}

// The one-shot peer-to-peer all-reduce against the CPU groups' sum in rank order, bitwise, on every
// rank: each dtype; sizes from one element to the slot's whole size, odd ones (the element tail) and an
// unaligned buffer (the scalar path); repeated calls (the two slots alternate, the call counts advance)
// eager and replayed from a captured graph.
TEST_F(CudaTp, P2pAllReduceEqualsRankOrderSum) {
  ProcessGroupOptions po;
  po.world = 2;
  po.argv = {proc::self_executable(), "--gtest_filter=" + current_test()};
  po.silence_worker_stdout = false;
  auto be = make_cuda_backend(DType::F32, local_rank_from_environment() % cuda_device_count());
  std::shared_ptr<RankProcess> ranks = RankProcess::start(po, *be);
  Communicator& host = ranks->group().comm();
  const int rank = ranks->rank(), world = ranks->world();
  constexpr size_t kMax = 64 << 10;
  std::string why;
  std::unique_ptr<P2pAllReduce> p2p = P2pAllReduce::open(host, *be, kMax, why);
  if (!p2p) {
    ranks->close();
    GTEST_SKIP() << "no peer-to-peer path between the GPUs: " << why;
  }
  EXPECT_EQ(p2p->max_bytes(), kMax);
  uint32_t salt = 0;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const size_t es = dtype_size(dt);
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(8), int64_t(1000), int64_t(4099), int64_t(kMax / es)}) {
      for (int64_t offset : {int64_t(0), int64_t(1)}) {
        Buffer b(*be, size_t(count + offset) * es);
        void* at = b.as<uint8_t>() + size_t(offset) * es;
        for (int call = 0; call < 5; ++call) {
          ++salt;
          std::vector<std::vector<uint8_t>> parts(static_cast<size_t>(world));
          std::vector<const void*> ptrs;
          for (int r = 0; r < world; ++r) {
            const std::vector<float> v = addend(r, count, salt);
            parts[size_t(r)].resize(size_t(count) * es);
            convert_from_f32(dt, v.data(), parts[size_t(r)].data(), size_t(count));
            ptrs.push_back(parts[size_t(r)].data());
          }
          std::vector<uint8_t> want(size_t(count) * es), got(want.size());
          std::vector<float> sum, widened;
          sum_in_rank_order(ptrs.data(), world, count, dt, want.data(), sum, widened);
          be->upload(at, parts[size_t(rank)].data(), want.size());
          if (call < 3) {
            p2p->all_reduce_sum(at, count, dt);
          } else {
            std::unique_ptr<Graph> g = be->capture([&] { p2p->all_reduce_sum(at, count, dt); });
            ASSERT_TRUE(g);
            g->replay();
          }
          be->download(got.data(), at, got.size());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
              << dtype_name(dt) << " count " << count << " offset " << offset << " call " << call << " rank " << rank;
        }
      }
    }
  }
  // Sizes past the slot are refused, naming them.
  try {
    Buffer b(*be, kMax + 4);
    p2p->all_reduce_sum(b.get(), int64_t(kMax / 4 + 1), DType::F32);
    ADD_FAILURE() << "a sum past the slot was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit its slot of 65536 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p2p->timed_out_on(), -1);
  be->synchronize();
  p2p.reset();
  const std::vector<ProcessGroup::Ended> ends = ranks->close();
  if (rank == 0)
    for (const auto& e : ends) EXPECT_TRUE(e.clean) << "rank " << e.rank << " " << e.how;
}

// The model over the peer-to-peer all-reduce (INGOT_TP_P2P_BYTES): check passes in f32 on every
// fixture and greedy bf16 tokens equal one rank's, as over NCCL; a bad value of either variable is
// refused naming it.
TEST_F(CudaTp, P2pAllReduceInTheModel) {
  const std::string env = "INGOT_TP_P2P_BYTES=262144 ";
  for (const std::string& f : kFixtures) {
    const std::string dir = fixture_dir(f);
    const auto [rc, out] = test::sh(env + test::q(ingot_binary()) + " check --tp 2 --device cuda --dtype fp32 --model " +
                                    test::q(dir) + " --reference " + test::q(dir + "/reference.safetensors"));
    EXPECT_EQ(rc, 0) << f << ":\n" << out;
    EXPECT_NE(out.find("check passed"), std::string::npos) << f << ":\n" << out;
    EXPECT_EQ(out.find("goes through NCCL"), std::string::npos) << f << ": the peer-to-peer path was declined:\n" << out;
    const std::string gen = test::q(ingot_binary()) + " generate --device cuda --dtype bf16 --model " + test::q(dir) +
                            " --prompt-ids 1,2,3,4,5 --max-new-tokens 32";
    const auto [rc1, one] = test::sh(gen);
    const auto [rc2, two] = test::sh(env + gen + " --tp 2");
    EXPECT_EQ(rc2, 0) << f << ":\n" << two;
    EXPECT_EQ(two, one) << f;
  }
  const std::string gen = test::q(ingot_binary()) + " generate --device cuda --tp 2 --model " +
                          test::q(fixture_dir("qwen3")) + " --prompt-ids 1,2,3";
  for (const char* bad : {"INGOT_TP_P2P_BYTES=lots", "INGOT_TP_P2P_BYTES=-1", "INGOT_TP_P2P_BYTES=99999999999"}) {
    const auto [rc, out] = test::sh(std::string(bad) + " " + gen);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(out.find(std::string(bad) + " is not a byte count"), std::string::npos) << bad << ":\n" << out;
  }
  const auto [rc, out] = test::sh("INGOT_TP_P2P_BYTES=4096 INGOT_TP_TIMEOUT_S=0 " + gen);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("INGOT_TP_TIMEOUT_S=0 is not a whole number of seconds"), std::string::npos) << out;
}

// A peer that is alive but never joins a step's collectives (here: rank 1 sleeps instead of decoding)
// does not hang rank 0: its wait for the step passes INGOT_TP_TIMEOUT_S, the NCCL communicator's
// watchdog aborts it, and the decode throws GroupStopped naming the limit, within a few seconds of it.
TEST_F(CudaTp, APeerAliveButAbsentStopsTheStepAfterTheTimeout) {
  ::setenv("INGOT_TP_TIMEOUT_S", "3", 1);  // rank 1, started from this process, inherits it
  ProcessGroupOptions po;
  po.world = 2;
  po.argv = {proc::self_executable(), "--gtest_filter=" + current_test()};
  po.silence_worker_stdout = false;
  auto be = make_cuda_backend(DType::BF16, local_rank_from_environment() % cuda_device_count());
  std::shared_ptr<RankProcess> ranks = RankProcess::start(po, *be);
  const int rank = ranks->rank();
  Engine engine = build_engine(fixture_dir("qwen3"), BuildOptions{DType::BF16});
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = 16;
  rt.tp = 2;
  {
    Model m(engine, *be, rt, ranks);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        m.decode({0}, {1}, {0});
        ADD_FAILURE() << "the step finished without its peer";
      } catch (const GroupStopped& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("INGOT_TP_TIMEOUT_S=3"), std::string::npos) << what;
        EXPECT_NE(what.find("did not take part"), std::string::npos) << what;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_GE(s, 3.0);
      EXPECT_LT(s, 8.0);
    }
  }
  ::unsetenv("INGOT_TP_TIMEOUT_S");
  ranks->close();
}

}  // namespace
}  // namespace ingot
#else
TEST(CudaTp, NeedsCudaAndNccl) { GTEST_SKIP() << "this build has no CUDA backend with NCCL"; }
#endif
