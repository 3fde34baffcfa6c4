// The process group (dist/process_group.h): tensor-parallel ranks as processes. The tests are SPMD as
// the command line is: a test that starts a group re-executes this test binary for ranks 1..N-1 with
// --gtest_filter naming that test, and every process runs the same body, rank 0 being the one ctest
// started. Each rank checks its own results against an in-process group over the same inputs
// (bitwise), and rank 0 checks that every worker exited cleanly. The mpirun tests start N copies of
// this binary themselves with Open MPI's or MPICH's variables set (no mpirun needed).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <mutex>
#include <thread>

#include "dist/in_process.h"
#include "dist/process_group.h"
#include "dist/rank_threads.h"
#include "dist/watchdog.h"
#include "test_helpers.h"

namespace ingot {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string current_test() {
  const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(t->test_suite_name()) + "." + t->name();
}

ProcessGroupOptions options(int world) {
  ProcessGroupOptions o;
  o.world = world;
  o.argv = {proc::self_executable(), "--gtest_filter=" + current_test()};
  o.silence_worker_stdout = false;  // a worker's failed expectation shows in the test's log
  o.join_timeout = 30s;
  return o;
}

// Rank r's contribution: values whose f32 sum depends on the order of the additions.
std::vector<uint8_t> contribution(int rank, int64_t n, DType dt) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = (rank % 2 ? -1.0f : 1.0f) * (1e4f + float(i)) + 0.37f * float(rank + i % 7);
  std::vector<uint8_t> out(size_t(n) * dtype_size(dt));
  convert_from_f32(dt, f.data(), out.data(), size_t(n));
  return out;
}

// What the in-process group gives rank `rank` for the same collective (threads of this process).
std::vector<uint8_t> in_process_reduce(int world, int rank, int64_t n, DType dt) {
  InProcessGroup g(world);
  RankThreads threads(g);
  std::vector<std::vector<uint8_t>> bufs;
  for (int r = 0; r < world; ++r) bufs.push_back(contribution(r, n, dt));
  threads.run([&](int r) { g.comm(r).all_reduce_sum(bufs[size_t(r)].data(), n, dt); });
  return bufs[size_t(rank)];
}

// Every collective at several sizes (0 and odd included), compared bitwise with the in-process group.
void exercise(Communicator& c) {
  const int world = c.world(), rank = c.rank();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {0, 1, 7, 1000, 4097}) {
      std::vector<uint8_t> buf = contribution(rank, n, dt);
      c.all_reduce_sum(buf.data(), n, dt);
      EXPECT_EQ(buf, in_process_reduce(world, rank, n, dt)) << "rank " << rank << " " << dtype_name(dt) << " n " << n;
    }
  for (size_t bytes : {size_t(0), size_t(3), size_t(1000)}) {
    std::vector<uint8_t> want(bytes * size_t(world));
    for (size_t i = 0; i < want.size(); ++i) want[i] = uint8_t(i * 31 + i / (bytes ? bytes : 1));
    std::vector<uint8_t> send(want.begin() + ptrdiff_t(bytes) * rank, want.begin() + ptrdiff_t(bytes) * (rank + 1));
    std::vector<uint8_t> recv(want.size(), 0xee);
    c.all_gather(send.data(), recv.data(), bytes);
    EXPECT_EQ(recv, want) << "separate buffers, " << bytes << " bytes";
    std::vector<uint8_t> in_place(want.size(), 0xee);
    std::memcpy(in_place.data() + bytes * size_t(rank), send.data(), bytes);
    c.all_gather(in_place.data() + bytes * size_t(rank), in_place.data(), bytes);
    EXPECT_EQ(in_place, want) << "in place, " << bytes << " bytes";
  }
  c.barrier();
  test::expect_error([&] { c.all_reduce_sum(nullptr, 0, DType::I32); }, {"i32", "not supported"});
}

void expect_clean_ends(ProcessGroup& g) {
  const std::vector<pid_t> pids = g.worker_pids();
  for (const auto& e : g.close()) EXPECT_TRUE(e.clean) << "rank " << e.rank << " " << e.how;
  for (pid_t p : pids) EXPECT_TRUE(::kill(p, 0) != 0 && errno == ESRCH) << "pid " << p << " is still there";
}

void run_collectives(int world) {
  auto g = ProcessGroup::start(options(world));
  ASSERT_EQ(g->world(), world);
  exercise(g->comm());
  if (g->rank() == 0) {
    EXPECT_EQ(int(g->worker_pids().size()), world - 1);
    expect_clean_ends(*g);
  } else {
    g->close();
  }
}

TEST(ProcessGroup, CollectivesOverTwoProcessesEqualTheInProcessGroup) { run_collectives(2); }

// The deadline on waits for a step's collectives (what the NCCL communicator stops the group with when
// a peer is alive but absent): a wait past the limit fires once, with how long it had lasted; waits
// that end in time, nested or not, never fire; an idle watchdog never fires and its destructor does
// not wait out the limit.
TEST(Watchdog, AWaitPastTheLimitFiresOnceAndWaitsInTimeNever) {
  using namespace std::chrono_literals;
  std::atomic<int> fired{0};
  std::atomic<int64_t> waited{-1};
  {
    Watchdog w(1000ms, [&](int64_t s) {
      waited = s;
      ++fired;
    });
    for (int i = 0; i < 20; ++i) {
      const Watchdog::Wait outer(&w);
      const Watchdog::Wait inner(&w);  // nested: the outermost is timed
      std::this_thread::sleep_for(20ms);
    }
    std::this_thread::sleep_for(1200ms);  // idle past the limit
    EXPECT_EQ(fired.load(), 0);
    EXPECT_FALSE(w.expired());
    w.begin();
    std::this_thread::sleep_for(1600ms);
    EXPECT_EQ(fired.load(), 1);
    EXPECT_TRUE(w.expired());
    w.end();
    const Watchdog::Wait again(&w);
    std::this_thread::sleep_for(1200ms);
    EXPECT_EQ(fired.load(), 1);  // once
  }
  EXPECT_EQ(waited.load(), 1);  // whole seconds: past one, under two
  const Watchdog::Wait none(nullptr);  // marks nothing
  const auto t0 = std::chrono::steady_clock::now();
  { Watchdog idle(std::chrono::hours(1), [](int64_t) {}); }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(Watchdog, TheTimeoutVariableIsCheckedNamingIt) {
  ::setenv("INGOT_TP_TIMEOUT_S", "7", 1);
  EXPECT_EQ(tp_timeout_from_env().count(), 7);
  for (const char* bad : {"0", "-3", "1.5", "86401", "ten", "30s"}) {
    ::setenv("INGOT_TP_TIMEOUT_S", bad, 1);
    test::expect_error([] { tp_timeout_from_env(); },
                       {"INGOT_TP_TIMEOUT_S=" + std::string(bad), "whole number of seconds in [1, 86400]"});
  }
  ::unsetenv("INGOT_TP_TIMEOUT_S");
  EXPECT_EQ(tp_timeout_from_env().count(), 300);
}
TEST(ProcessGroup, CollectivesOverFourProcessesEqualTheInProcessGroup) { run_collectives(4); }

// A worker killed while the others are in a collective: every other rank throws, within seconds,
// an error naming the rank and the signal; nothing is left running.
TEST(ProcessGroup, AKilledWorkerStopsEveryRankNamingIt) {
  auto g = ProcessGroup::start(options(3));
  std::vector<float> v(100, 1.0f);
  g->comm().all_reduce_sum(v.data(), 100, DType::F32);
  EXPECT_EQ(v[0], 3.0f);
  if (g->rank() == 2) ::raise(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    g->comm().all_reduce_sum(v.data(), 100, DType::F32);
    ADD_FAILURE() << "rank " << g->rank() << ": the collective returned";
  } catch (const GroupStopped& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 2 (pid"), std::string::npos) << m;
    EXPECT_NE(m.find("killed by signal 9"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Once stopped, every collective refuses at once.
  EXPECT_THROW(g->comm().barrier(), GroupStopped);
  if (g->rank() != 0) return;
  const std::vector<pid_t> pids = g->worker_pids();
  const auto ends = g->close(10s);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_TRUE(ends[0].clean) << ends[0].how;  // rank 1 saw the error and its test passed
  EXPECT_EQ(ends[1].how, "was killed by signal 9 (Killed)");
  for (pid_t p : pids) EXPECT_TRUE(::kill(p, 0) != 0 && errno == ESRCH) << "pid " << p << " is still there";
}

// The watch (for a rank blocked where the group cannot see, e.g. inside an NCCL kernel): rank 0, in no
// collective, is told within moments that a worker was killed, naming it; an orderly close with the
// watch on (unwatched first) tells nobody anything.
TEST(ProcessGroup, TheWatchSeesAWorkerDieOutsideAnyCollective) {
  auto g = ProcessGroup::start(options(3));
  std::mutex mu;
  std::vector<std::string> told;
  g->watch([&](const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    told.push_back(why);
  });
  g->comm().barrier();
  if (g->rank() == 2) ::raise(SIGKILL);
  if (g->rank() == 1) {
    // Rank 1 watches rank 0 only, which stays: nothing to tell; it leaves when rank 0 closes.
    g->close(10s);
    std::lock_guard<std::mutex> l(mu);
    EXPECT_TRUE(told.empty()) << told.front();
    return;
  }
  for (int i = 0; i < 250; ++i) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!told.empty()) break;
    }
    std::this_thread::sleep_for(20ms);
  }
  {
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(told.size(), 1u);
    EXPECT_NE(told[0].find("rank 2 (pid"), std::string::npos) << told[0];
    EXPECT_NE(told[0].find("ended while rank 0 was running"), std::string::npos) << told[0];
  }
  g->unwatch();
  const auto ends = g->close(10s);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_TRUE(ends[0].clean) << ends[0].how;
  EXPECT_EQ(ends[1].how, "was killed by signal 9 (Killed)");
}

TEST(ProcessGroup, TheWatchIsQuietThroughAnOrderlyClose) {
  auto g = ProcessGroup::start(options(2));
  std::atomic<int> told{0};
  g->watch([&](const std::string&) { ++told; });
  g->comm().barrier();
  const auto ends = g->close(10s);  // unwatches first: the worker leaving is no news
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(told.load(), 0);
  if (g->rank() == 0) {
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_TRUE(ends[0].clean) << ends[0].how;
  }
}

TEST(ProcessGroup, AWorkerThatExitsIsNamedWithItsCode) {
  auto g = ProcessGroup::start(options(2));
  g->comm().barrier();
  if (g->rank() == 1) std::_Exit(3);
  test::expect_error([&] { g->comm().barrier(); }, {"rank 1 (pid", "exited with code 3", "during barrier"});
  const auto ends = g->close(10s);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].how, "exited with code 3");
}

TEST(ProcessGroup, RanksCallingDifferentCollectivesStop) {
  auto g = ProcessGroup::start(options(2));
  std::vector<float> v(4, 1.0f);
  if (g->rank() == 0)
    test::expect_error([&] { g->comm().all_reduce_sum(v.data(), 4, DType::F32); },
                       {"rank 1 called barrier", "rank 0 called all_reduce_sum", "same collectives"});
  else
    test::expect_error([&] { g->comm().barrier(); }, {"rank 1 called barrier"});
  if (g->rank() == 0)
    for (const auto& e : g->close(10s)) EXPECT_TRUE(e.clean) << e.how;
}

// --- bad input ---

class ScopedEnv {
 public:
  void set(const std::string& name, const std::string& value) {
    remember(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    remember(name);
    ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  void remember(const std::string& name) {
    const char* v = std::getenv(name.c_str());
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(ProcessGroupBadInput, WorldOutsideTheLimit) {
  for (int w : {0, 65}) {
    ProcessGroupOptions o;
    o.world = w;
    test::expect_error([&] { ProcessGroup::start(o); }, {std::to_string(w) + " ranks", "[1, 64]"});
  }
}

TEST(ProcessGroupBadInput, MalformedOrContradictoryWorkerVariable) {
  ScopedEnv env;
  ProcessGroupOptions o;
  o.world = 2;
  env.set(kTpWorkerEnv, "nonsense");
  test::expect_error([&] { ProcessGroup::start(o); }, {"INGOT_TP_WORKER=nonsense", "malformed"});
  env.set(kTpWorkerEnv, "1,3,0123456789abcdef0123456789abcdef,/tmp/x.sock");
  test::expect_error([&] { ProcessGroup::start(o); }, {"a world of 3", "asks for 2"});
  env.set(kTpWorkerEnv, "2,2,0123456789abcdef0123456789abcdef,/tmp/x.sock");
  test::expect_error([&] { ProcessGroup::start(o); }, {"rank 2 is outside [1, 2)"});
  env.set(kTpWorkerEnv, "1,2,0123456789abcdef0123456789abcdef,/nonexistent/ingot-tp.sock");
  test::expect_error([&] { ProcessGroup::start(o); }, {"rank 1", "cannot connect to /nonexistent/ingot-tp.sock"});
}

// The GPU a rank picks (one process per GPU) comes from local_rank_from_environment: a started
// worker's rank, under mpirun the node-local rank the launcher gives (else the global rank), and 0
// for a plain run even with a stray LOCAL_RANK.
TEST(ProcessGroup, LocalRankFromTheEnvironment) {
  ScopedEnv env;
  for (const char* v : {kTpWorkerEnv, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                        "MPI_LOCALRANKID", "LOCAL_RANK"})
    env.unset(v);
  EXPECT_EQ(local_rank_from_environment(), 0);
  env.set("LOCAL_RANK", "3");
  EXPECT_EQ(local_rank_from_environment(), 0) << "LOCAL_RANK counts only under mpirun";
  env.set("OMPI_COMM_WORLD_RANK", "5");
  EXPECT_EQ(local_rank_from_environment(), 3);
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  EXPECT_EQ(local_rank_from_environment(), 1);
  env.unset("OMPI_COMM_WORLD_LOCAL_RANK");
  env.unset("LOCAL_RANK");
  EXPECT_EQ(local_rank_from_environment(), 5);
  env.unset("OMPI_COMM_WORLD_RANK");
  env.set("PMI_RANK", "2");
  EXPECT_EQ(local_rank_from_environment(), 2);
  env.set("MPI_LOCALRANKID", "0");
  EXPECT_EQ(local_rank_from_environment(), 0);
  env.set("MPI_LOCALRANKID", "x");
  test::expect_error([] { local_rank_from_environment(); }, {"MPI_LOCALRANKID", "'x' is not a whole number"});
  env.set("MPI_LOCALRANKID", "-1");
  test::expect_error([] { local_rank_from_environment(); }, {"MPI_LOCALRANKID=-1", "0 or more"});
  env.set(kTpWorkerEnv, "3,4,0123456789abcdef0123456789abcdef,/tmp/x.sock");
  EXPECT_EQ(local_rank_from_environment(), 3) << "a started worker's rank wins";
}

TEST(ProcessGroupBadInput, MpiVariablesAndRendezvousDirectory) {
  ScopedEnv env;
  ProcessGroupOptions o;
  o.world = 2;
  o.join_timeout = 1s;
  env.unset("PMI_RANK");
  env.unset("PMI_SIZE");
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.unset("OMPI_COMM_WORLD_SIZE");
  test::expect_error([&] { ProcessGroup::start(o); }, {"OMPI_COMM_WORLD_SIZE is not set"});
  env.set("OMPI_COMM_WORLD_SIZE", "3");
  test::expect_error([&] { ProcessGroup::start(o); }, {"--tp 2", "mpirun started 3 ranks"});
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  env.set("OMPI_COMM_WORLD_RANK", "5");
  test::expect_error([&] { ProcessGroup::start(o); }, {"OMPI_COMM_WORLD_RANK=5 is outside [0, 2)"});
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.unset(kTpRendezvousEnv);
  test::expect_error([&] { ProcessGroup::start(o); }, {"set INGOT_TP_RENDEZVOUS"});
  env.set(kTpRendezvousEnv, "/nonexistent/rendezvous");
  test::expect_error([&] { ProcessGroup::start(o); }, {"INGOT_TP_RENDEZVOUS=/nonexistent/rendezvous", "No such file"});
  proc::TempDir dir("ingot-tp-test-");
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "x";
  env.set(kTpRendezvousEnv, file);
  test::expect_error([&] { ProcessGroup::start(o); }, {"not a directory"});
  const std::string open_dir = dir.path() + "/open";
  ::mkdir(open_dir.c_str(), 0700);
  ::chmod(open_dir.c_str(), 0777);
  env.set(kTpRendezvousEnv, open_dir);
  test::expect_error([&] { ProcessGroup::start(o); }, {"writable by other users (mode 0777)"});
  ::rmdir(open_dir.c_str());
  std::string deep = dir.path();
  while (deep.size() < 120) {
    deep += "/abcdefghijklmnop";
    ::mkdir(deep.c_str(), 0700);
  }
  env.set(kTpRendezvousEnv, deep);
  test::expect_error([&] { ProcessGroup::start(o); }, {"longer than a Unix socket address holds"});
  if (::geteuid() == 0) {
    // root writes anywhere a mode allows nothing; /proc refuses even root.
    env.set(kTpRendezvousEnv, "/proc");
    test::expect_error([&] { ProcessGroup::start(o); }, {"INGOT_TP_RENDEZVOUS=/proc", "cannot write"});
  }
  fs::remove_all(dir.path());
}

// A process that connects with the wrong token is refused with the reason, and does not count as a
// rank: rank 0 goes on waiting and then names the rank that never came.
TEST(ProcessGroupBadInput, AStrangerWithTheWrongTokenIsRefused) {
  ScopedEnv env;
  proc::TempDir dir("ingot-tp-test-");
  env.unset("PMI_RANK");
  env.unset("PMI_SIZE");
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  env.set(kTpRendezvousEnv, dir.path());
  std::string refusal;
  std::thread stranger([&] {
    const std::string sock = dir.path() + "/ingot-tp.sock";
    for (int i = 0; i < 200 && refusal.empty(); ++i) {
      std::this_thread::sleep_for(10ms);
      proc::Fd c = proc::connect_unix(sock);
      if (!c) continue;
      struct {
        uint32_t version = 1;
        int32_t world = 2, rank = 1, pid = 0;
        char token[32];
      } hello;
      std::memset(hello.token, 'a', sizeof hello.token);
      proc::MsgHeader h;
      h.type = uint32_t(proc::MsgType::Hello);
      h.bytes = sizeof hello;
      proc::MsgHeader r;
      if (!proc::send_msg(c.get(), h, &hello) || !proc::recv_all(c.get(), &r, sizeof r)) continue;
      std::string text(r.bytes, '\0');
      if (r.type == uint32_t(proc::MsgType::Refused) && proc::recv_all(c.get(), text.data(), text.size())) refusal = text;
    }
  });
  ProcessGroupOptions o;
  o.world = 2;
  o.join_timeout = 3s;
  test::expect_error([&] { ProcessGroup::start(o); }, {"rank(s) 1 of 2 did not join within", "INGOT_TP_RENDEZVOUS="});
  stranger.join();
  EXPECT_EQ(refusal, "rank 0 refused the connection: wrong session token");
  // Rank 0 removed its socket and token.
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// --- mpirun mode ---

// The body every copy runs: skipped unless started by MpirunVariables below.
TEST(ProcessGroupMpi, RankBody) {
  const char* results = std::getenv("INGOT_TEST_MPI_RESULTS");
  if (!results) GTEST_SKIP() << "run by ProcessGroupMpi.* with the MPI variables set";
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!size) size = std::getenv("PMI_SIZE");
  ASSERT_NE(size, nullptr);
  ProcessGroupOptions o;
  o.world = std::atoi(size);
  o.join_timeout = 30s;
  auto g = ProcessGroup::start(o);
  exercise(g->comm());
  EXPECT_TRUE(g->close().empty());  // under mpirun rank 0 started no one
  if (!::testing::Test::HasFailure()) std::ofstream(std::string(results) + "/rank-" + std::to_string(g->rank())) << "ok";
}

void run_mpi_copies(int world, const char* rank_var, const char* size_var) {
  proc::TempDir rendezvous("ingot-tp-rdv-"), results("ingot-tp-res-");
  std::vector<proc::Child> copies;
  for (int r = 0; r < world; ++r) {
    proc::Child::Spawn s;
    s.exe = proc::self_executable();
    s.argv = {s.exe, "--gtest_filter=ProcessGroupMpi.RankBody"};
    s.env = proc::environment_without({"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", kTpWorkerEnv});
    s.env.push_back(std::string(rank_var) + "=" + std::to_string(r));
    s.env.push_back(std::string(size_var) + "=" + std::to_string(world));
    s.env.push_back(std::string(kTpRendezvousEnv) + "=" + rendezvous.path());
    s.env.push_back("INGOT_TEST_MPI_RESULTS=" + results.path());
    copies.emplace_back(s);
  }
  for (int r = 0; r < world; ++r) {
    auto st = copies[size_t(r)].poll(60s);
    ASSERT_TRUE(st.has_value()) << "rank " << r << " did not end";
    EXPECT_EQ(proc::describe_exit(*st), "exited with code 0") << "rank " << r;
    EXPECT_TRUE(fs::exists(results.path() + "/rank-" + std::to_string(r))) << "rank " << r << " did not finish";
  }
  EXPECT_TRUE(fs::is_empty(rendezvous.path())) << "rank 0 left files in the rendezvous directory";
}

TEST(ProcessGroupMpi, OpenMpiVariablesThreeRanks) { run_mpi_copies(3, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"); }
TEST(ProcessGroupMpi, PmiVariablesTwoRanks) { run_mpi_copies(2, "PMI_RANK", "PMI_SIZE"); }

}  // namespace
}  // namespace ingot
