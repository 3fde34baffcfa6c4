#include "dist/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "core/error.h"
#include "dist/reduce.h"

namespace ingot {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// Bumped whenever a message's layout or meaning changes, so ranks of different builds refuse each other.
constexpr uint32_t kProtocolVersion = 1;
constexpr const char* kSocketName = "ingot-tp.sock";
constexpr const char* kTokenName = "ingot-tp.token";

enum class Op : uint32_t { AllReduce = 1, AllGather, Barrier };

const char* op_name(uint32_t op) {
  switch (Op(op)) {
    case Op::AllReduce: return "all_reduce_sum";
    case Op::AllGather: return "all_gather";
    case Op::Barrier: return "barrier";
  }
  return "an unknown collective";
}

struct Hello {
  uint32_t version = kProtocolVersion;
  int32_t world = 0, rank = 0, pid = 0;
  char token[32] = {};
};

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int parse_int(const std::string& s, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || errno || v < -1000000 || v > 1000000) throw Error(what + ": '" + s + "' is not a whole number");
  return int(v);
}

void check_world(int world, const std::string& what) {
  if (world < 1 || world > kMaxTensorParallel)
    throw Error("tensor parallel: " + what + " asks for " + std::to_string(world) + " ranks, outside [1, " +
                std::to_string(kMaxTensorParallel) + "]");
}

std::string ms_text(std::chrono::milliseconds t) { return std::to_string(double(t.count()) / 1000.0).substr(0, 5) + " s"; }

// The pid and user at the other end of a Unix socket, from the kernel (not from what the peer says).
ucred peer_credentials(int fd) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) c.pid = -1;
  return c;
}

bool send_text(int fd, proc::MsgType type, const std::string& text) {
  proc::MsgHeader h;
  h.type = uint32_t(type);
  h.bytes = text.size();
  return proc::send_msg(fd, h, text.data());
}

// mpirun mode: the directory must exist and be the user's own, writable by no one else, since the
// session token rank 0 leaves there is what keeps other users' processes out.
void check_rendezvous_dir(const std::string& dir) {
  const std::string what = std::string(kTpRendezvousEnv) + "=" + dir;
  if (dir.empty())
    throw Error(std::string("tensor parallel under mpirun: set ") + kTpRendezvousEnv +
                " to a directory of yours on this host that every rank sees (docs/tensor-parallel.md)");
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) throw Error(what + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw Error(what + ": not a directory");
  if (st.st_uid != ::geteuid()) throw Error(what + ": the directory belongs to another user (uid " + std::to_string(st.st_uid) + ")");
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    throw Error(what + ": the directory is writable by other users (mode " + mode + "); use one only you can write");
  }
}

}  // namespace

// One collective's arguments: what this rank sends, where the result goes, and (rank 0) how the
// workers' contributions become the result.
struct ProcessGroup::Collective {
  Op op;
  uint32_t aux = 0;          // all-reduce: the dtype
  uint64_t send_bytes = 0;   // each rank's contribution
  const void* send = nullptr;
  uint64_t result_bytes = 0;
  void* result = nullptr;
  std::function<void*(int rank)> slot;  // rank 0: where rank r's contribution is read to
  std::function<void()> combine;        // rank 0: makes the result once every contribution is in
};

namespace {
// The header of a collective's message: a worker's contribution (Data) or rank 0's result (Result).
proc::MsgHeader header(proc::MsgType type, uint32_t op, uint32_t aux, uint64_t seq, uint64_t bytes) {
  proc::MsgHeader h;
  h.type = uint32_t(type);
  h.op = op;
  h.seq = seq;
  h.bytes = bytes;
  h.aux = aux;
  return h;
}
}  // namespace

class ProcessGroup::Comm final : public Communicator {
 public:
  explicit Comm(ProcessGroup& g) : g_(g) {}
  int rank() const override { return g_.rank_; }
  int world() const override { return g_.world_; }
  std::string describe() const override { return "processes over local sockets (rank-order sums)"; }

  void all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    check_reduce_dtype(dtype);
    const uint64_t bytes = uint64_t(count) * dtype_size(dtype);
    Collective c{Op::AllReduce, uint32_t(dtype), bytes, buf, bytes, buf, {}, {}};
    if (g_.rank_ == 0) {
      c.slot = [&](int r) -> void* {
        g_.scratch_[size_t(r)].resize(bytes);
        return g_.scratch_[size_t(r)].data();
      };
      c.combine = [&] {
        // The same reduction as the in-process group (dist/reduce.h), so the bits are the same.
        std::vector<const void*> parts(size_t(g_.world_));
        parts[0] = buf;
        for (int r = 1; r < g_.world_; ++r) parts[size_t(r)] = g_.scratch_[size_t(r)].data();
        sum_in_rank_order(parts.data(), g_.world_, count, dtype, buf, g_.sum_, g_.widened_);
      };
    }
    g_.run_collective(c);
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    auto* out = static_cast<uint8_t*>(recv);
    Collective c{Op::AllGather, 0, bytes, send, uint64_t(bytes) * uint64_t(g_.world_), recv, {}, {}};
    if (g_.rank_ == 0) {
      c.slot = [&](int r) -> void* { return out + size_t(r) * bytes; };
      c.combine = [&] {
        if (send != out && bytes > 0) std::memmove(out, send, bytes);
      };
    }
    g_.run_collective(c);
  }

  void barrier() override {
    Collective c{Op::Barrier, 0, 0, nullptr, 0, nullptr, {}, {}};
    if (g_.rank_ == 0) {
      c.slot = [](int) -> void* { return nullptr; };
      c.combine = [] {};
    }
    g_.run_collective(c);
  }

 private:
  ProcessGroup& g_;
};

ProcessGroup::ProcessGroup(int rank, int world)
    : rank_(rank), world_(world), peer_pids_(size_t(world), 0), comm_(std::make_unique<Comm>(*this)) {}

Communicator& ProcessGroup::comm() { return *comm_; }

std::vector<pid_t> ProcessGroup::worker_pids() const {
  std::vector<pid_t> out;
  for (size_t r = 1; r < children_.size(); ++r) out.push_back(children_[r].pid());
  return out;
}

int local_rank_from_environment() {
  auto value = [](const char* var) {
    const std::string v = getenv_str(var);
    const int r = parse_int(v, var);
    if (r < 0) throw Error(std::string(var) + "=" + v + ": a rank must be 0 or more");
    return r;
  };
  const std::string worker = getenv_str(kTpWorkerEnv);
  if (!worker.empty()) {
    // "rank,world,token,socket": only the rank is read here; join_as_worker checks the whole spec.
    const std::string r = worker.substr(0, worker.find(','));
    const int rank = parse_int(r, kTpWorkerEnv);
    if (rank < 0) throw Error(std::string(kTpWorkerEnv) + ": rank " + r + " is negative");
    return rank;
  }
  // The local-rank variables count only under mpirun (a rank variable set, as start() requires): a
  // LOCAL_RANK left in the environment of a plain run must not move rank 0 off GPU 0.
  if (!getenv_str("OMPI_COMM_WORLD_RANK").empty()) {
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"})
      if (!getenv_str(var).empty()) return value(var);
    return value("OMPI_COMM_WORLD_RANK");
  }
  if (!getenv_str("PMI_RANK").empty()) {
    for (const char* var : {"MPI_LOCALRANKID", "LOCAL_RANK"})
      if (!getenv_str(var).empty()) return value(var);
    return value("PMI_RANK");
  }
  return 0;
}

int tp_rank_from_environment(int world) {
  const auto in_world = [world](const std::string& var, const std::string& v) {
    const int r = parse_int(v, var);
    if (r < 0 || r >= world)
      throw Error(var + "=" + v + ": rank " + std::to_string(r) + " is outside [0, " + std::to_string(world) + ") (--tp " +
                  std::to_string(world) + ")");
    return r;
  };
  const std::string worker = getenv_str(kTpWorkerEnv);
  if (!worker.empty()) return in_world(kTpWorkerEnv, worker.substr(0, worker.find(',')));  // "rank,world,token,socket"
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const std::string v = getenv_str(var);
    if (!v.empty()) return in_world(var, v);
  }
  return 0;
}

std::unique_ptr<ProcessGroup> ProcessGroup::start(const ProcessGroupOptions& options) {
  check_world(options.world, "the process group");
  const std::string worker = getenv_str(kTpWorkerEnv);
  if (!worker.empty()) {
    std::unique_ptr<ProcessGroup> g(new ProcessGroup(1, options.world));  // rank set from the spec
    g->guarded_start([&] { g->join_as_worker(worker, options); });
    return g;
  }
  // mpirun: Open MPI's variables, else MPICH / Hydra's PMI ones.
  for (const auto& vars : {std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, std::pair{"PMI_RANK", "PMI_SIZE"}}) {
    // Plain variables, not a structured binding: clang before 16 refuses to capture a binding in the
    // lambda below.
    const char* const rank_var = vars.first;
    const char* const size_var = vars.second;
    const std::string r = getenv_str(rank_var), s = getenv_str(size_var);
    if (r.empty() && s.empty()) continue;
    if (r.empty() || s.empty())
      throw Error(std::string("tensor parallel under mpirun: ") + (r.empty() ? rank_var : size_var) + " is not set but " +
                  (r.empty() ? size_var : rank_var) + " is");
    const int rank = parse_int(r, rank_var), size = parse_int(s, size_var);
    check_world(size, size_var);
    if (rank < 0 || rank >= size)
      throw Error(std::string(rank_var) + "=" + r + " is outside [0, " + s + ") (" + size_var + "=" + s + ")");
    if (size != options.world)
      throw Error("tensor parallel: --tp " + std::to_string(options.world) + " but mpirun started " + s + " ranks (" +
                  size_var + "); give the same number to both");
    std::unique_ptr<ProcessGroup> g(new ProcessGroup(rank, size));
    g->guarded_start([&] { g->meet_under_mpi(rank, options, rank_var); });
    return g;
  }
  std::unique_ptr<ProcessGroup> g(new ProcessGroup(0, options.world));
  g->guarded_start([&] { g->launch(options); });
  return g;
}

void ProcessGroup::guarded_start(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    // The workers that did join learn why in their first collective; the destructor then waits only
    // briefly for the started ones.
    broken_ = e.what();
    tell_workers_stopped();
    throw;
  }
}

void ProcessGroup::launch(const ProcessGroupOptions& options) {
  peers_.resize(size_t(world_));
  scratch_.resize(size_t(world_));
  peer_pids_[0] = ::getpid();
  if (world_ == 1) return;
  const std::string exe = options.exe.empty() ? proc::self_executable() : options.exe;
  if (exe.empty() || exe[0] != '/') throw Error("tensor parallel: the worker executable '" + exe + "' is not an absolute path");
  const std::vector<std::string> argv = options.argv.empty() ? proc::self_command_line() : options.argv;
  const std::string token = proc::random_token();
  // A private directory (0700) holds the socket: only this user reaches it, and the token keeps out
  // this user's other processes. It goes as soon as every worker joined.
  proc::TempDir dir("ingot-tp-");
  const std::string path = dir.path() + "/" + kSocketName;
  proc::Fd listener = proc::listen_unix(path);
  const std::vector<std::string> base_env = proc::environment_without({kTpWorkerEnv});
  children_.reserve(size_t(world_));
  children_.emplace_back();  // rank 0: this process
  for (int r = 1; r < world_; ++r) {
    proc::Child::Spawn s{exe, argv, base_env, options.silence_worker_stdout, true};
    s.env.push_back(std::string(kTpWorkerEnv) + "=" + std::to_string(r) + "," + std::to_string(world_) + "," + token +
                    "," + path);
    children_.emplace_back(s);
  }
  accept_workers(listener.get(), token, options.join_timeout, "");
}

void ProcessGroup::accept_workers(int listen_fd, const std::string& token, std::chrono::milliseconds timeout,
                                  const std::string& where) {
  const auto deadline = Clock::now() + timeout;
  int missing = world_ - 1;
  while (missing > 0) {
    for (int r = 1; r < int(children_.size()); ++r)
      if (!peers_[size_t(r)])
        if (auto st = children_[size_t(r)].poll())
          throw Error("tensor parallel: rank " + std::to_string(r) + " (pid " + std::to_string(children_[size_t(r)].pid()) +
                      ") " + proc::describe_exit(*st) + " before it joined the group");
    if (!proc::wait_readable(listen_fd, std::min(deadline, Clock::now() + 100ms))) {
      if (Clock::now() < deadline) continue;
      std::string list;
      for (int r = 1; r < world_; ++r)
        if (!peers_[size_t(r)]) list += (list.empty() ? "" : ", ") + std::to_string(r);
      throw Error("tensor parallel: rank(s) " + list + " of " + std::to_string(world_) + " did not join within " +
                  ms_text(timeout) + where);
    }
    proc::Fd c(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) continue;
    // A stranger that says nothing is dropped after a few seconds rather than holding up the group.
    proc::MsgHeader h;
    Hello hello;
    bool ok = false;
    try {
      ok = proc::recv_all(c.get(), &h, sizeof h, Clock::now() + 5s) && h.type == uint32_t(proc::MsgType::Hello) &&
           h.bytes == sizeof hello && proc::recv_all(c.get(), &hello, sizeof hello, Clock::now() + 5s);
    } catch (const Error&) {
      ok = false;
    }
    if (!ok) continue;
    const ucred cred = peer_credentials(c.get());
    const int r = hello.rank;
    std::string refuse;
    if (hello.version != kProtocolVersion)
      refuse = "protocol version " + std::to_string(hello.version) + ", rank 0 speaks " + std::to_string(kProtocolVersion);
    else if (std::string(hello.token, sizeof hello.token) != token)
      refuse = "wrong session token";
    else if (hello.world != world_)
      refuse = "the connecting rank says the world is " + std::to_string(hello.world) + ", rank 0's is " + std::to_string(world_);
    else if (r < 1 || r >= world_)
      refuse = "rank " + std::to_string(r) + " is outside [1, " + std::to_string(world_) + ")";
    else if (peers_[size_t(r)])
      refuse = "rank " + std::to_string(r) + " already joined";
    else if (cred.uid != ::geteuid())
      refuse = "the connecting process belongs to another user";
    else if (r < int(children_.size()) && cred.pid != children_[size_t(r)].pid())
      refuse = "pid " + std::to_string(cred.pid) + " is not the process started as rank " + std::to_string(r);
    if (!refuse.empty()) {
      send_text(c.get(), proc::MsgType::Refused, "rank 0 refused the connection: " + refuse);
      continue;
    }
    proc::MsgHeader welcome;
    welcome.type = uint32_t(proc::MsgType::Welcome);
    if (!proc::send_msg(c.get(), welcome, nullptr)) continue;
    peer_pids_[size_t(r)] = cred.pid;
    peers_[size_t(r)] = std::move(c);
    --missing;
  }
}

void ProcessGroup::join_as_worker(const std::string& spec, const ProcessGroupOptions& options) {
  dies_with_rank0_ = true;  // rank 0 started it with PR_SET_PDEATHSIG (proc::Child)
  // "rank,world,token,socket path" (the path last: it may hold commas).
  const std::string what = std::string(kTpWorkerEnv) + "=" + spec;
  std::vector<std::string> f;
  size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) throw Error(what + ": malformed (ingot sets it for the workers it starts)");
    f.push_back(spec.substr(pos, comma - pos));
    pos = comma + 1;
  }
  f.push_back(spec.substr(pos));
  rank_ = parse_int(f[0], kTpWorkerEnv);
  const int world = parse_int(f[1], kTpWorkerEnv);
  if (world != world_)
    throw Error(what + ": a world of " + std::to_string(world) + " but this command asks for " + std::to_string(world_));
  if (rank_ < 1 || rank_ >= world_)
    throw Error(what + ": rank " + f[0] + " is outside [1, " + std::to_string(world_) + ")");
  if (f[2].size() != 32 || f[3].empty() || f[3][0] != '/') throw Error(what + ": malformed token or socket path");
  peers_.resize(1);
  connect_to_root(f[3], f[2], false, options.join_timeout);
}

void ProcessGroup::meet_under_mpi(int rank, const ProcessGroupOptions& options, const std::string& rank_var) {
  const std::string dir = getenv_str(kTpRendezvousEnv);
  check_rendezvous_dir(dir);
  const std::string sock = dir + "/" + kSocketName, token_file = dir + "/" + kTokenName;
  if (rank != 0) {
    peers_.resize(1);
    connect_to_root(sock, token_file, true, options.join_timeout);
    return;
  }
  peers_.resize(size_t(world_));
  scratch_.resize(size_t(world_));
  peer_pids_[0] = ::getpid();
  // What an earlier run that crashed left behind goes first; a worker that read its token is refused
  // and tries again with the new one.
  ::unlink(sock.c_str());
  ::unlink(token_file.c_str());
  const std::string token = proc::random_token();
  const std::string tmp = token_file + ".tmp." + std::to_string(::getpid());
  {
    proc::Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!f) throw Error(std::string(kTpRendezvousEnv) + "=" + dir + ": cannot write " + tmp + ": " + std::strerror(errno));
    proc::FileGuard tmp_guard(tmp);
    if (::write(f.get(), token.data(), token.size()) != ssize_t(token.size()) || ::rename(tmp.c_str(), token_file.c_str()) != 0)
      throw Error(std::string(kTpRendezvousEnv) + "=" + dir + ": cannot write " + token_file + ": " + std::strerror(errno));
  }
  proc::FileGuard token_guard(token_file);
  proc::Fd listener = proc::listen_unix(sock);
  proc::FileGuard sock_guard(sock);
  accept_workers(listener.get(), token, options.join_timeout,
                 " (under mpirun, " + rank_var + "; are they all started with " + kTpRendezvousEnv + "=" + dir + "?)");
}

void ProcessGroup::connect_to_root(const std::string& path, const std::string& token_or_file, bool token_is_file,
                                   std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last = "nobody listens at " + path;
  for (;;) {
    if (Clock::now() >= deadline)
      throw Error("tensor parallel: rank " + std::to_string(rank_) + " could not join rank 0 within " + ms_text(timeout) +
                  ": " + last);
    std::string token = token_or_file;
    if (token_is_file) {
      std::ifstream f(token_or_file);
      token.clear();
      if (!(f >> token) || token.size() != 32) {
        last = "rank 0 has not written " + token_or_file + " yet";
        std::this_thread::sleep_for(50ms);
        continue;
      }
    }
    proc::Fd c = proc::connect_unix(path);
    if (!c) {
      last = "cannot connect to " + path + ": " + std::strerror(errno);
      if (!token_is_file) throw Error("tensor parallel: rank " + std::to_string(rank_) + ": " + last);
      std::this_thread::sleep_for(50ms);
      continue;
    }
    Hello hello;
    hello.world = world_;
    hello.rank = rank_;
    hello.pid = ::getpid();
    std::memcpy(hello.token, token.data(), std::min(token.size(), sizeof hello.token));
    proc::MsgHeader h;
    h.type = uint32_t(proc::MsgType::Hello);
    h.bytes = sizeof hello;
    proc::MsgHeader reply;
    if (proc::send_msg(c.get(), h, &hello) && proc::recv_all(c.get(), &reply, sizeof reply, deadline)) {
      if (reply.type == uint32_t(proc::MsgType::Welcome)) {
        peer_pids_[0] = peer_credentials(c.get()).pid;
        peers_[0] = std::move(c);
        return;
      }
      std::string text(std::min<uint64_t>(reply.bytes, 4096), '\0');
      if (reply.type == uint32_t(proc::MsgType::Refused) && proc::recv_all(c.get(), text.data(), text.size(), deadline))
        last = text;
      else
        last = "rank 0 answered with an unexpected message";
    } else {
      last = "rank 0 closed the connection during the introduction";
    }
    // Started by rank 0, the introduction cannot be out of date: a refusal is final. Under mpirun the
    // token read may be an earlier run's, so read it again.
    if (!token_is_file) throw Error("tensor parallel: rank " + std::to_string(rank_) + ": " + last);
    std::this_thread::sleep_for(50ms);
  }
}

void ProcessGroup::check_usable() const {
  if (!broken_.empty()) throw GroupStopped(broken_);
  if (closed_) throw GroupStopped("tensor parallel: the process group was closed");
}

void ProcessGroup::run_collective(Collective& c) {
  check_usable();
  ++seq_;
  if (world_ == 1) {
    if (c.combine) c.combine();
    return;
  }
  if (rank_ == 0) root_collective(c);
  else worker_collective(c);
}

void ProcessGroup::tell_workers_stopped() {
  if (rank_ != 0) return;
  for (size_t r = 1; r < peers_.size(); ++r)
    if (peers_[r]) send_text(peers_[r].get(), proc::MsgType::Abort, broken_);
}

void ProcessGroup::stop(const std::string& reason) {
  broken_ = "tensor parallel: " + reason + "; the group stopped";
  tell_workers_stopped();
  throw GroupStopped(broken_);
}

void ProcessGroup::rank_lost(int r, const std::string& what) {
  std::string who = "rank " + std::to_string(r) + " (pid " + std::to_string(peer_pids_[size_t(r)]) + ")";
  peers_[size_t(r)].reset();
  if (r < int(children_.size())) {
    // The socket closes while the process exits; its status follows within moments.
    if (auto st = children_[size_t(r)].poll(2s)) stop(who + " " + proc::describe_exit(*st) + " " + what);
    stop(who + " closed its connection " + what + " while still running");
  }
  stop(who + " closed its connection " + what + ": the process ended or was killed");
}

void ProcessGroup::root_collective(Collective& c) {
  const std::string during = "during " + std::string(op_name(uint32_t(c.op))) + " #" + std::to_string(seq_);
  std::vector<int> pending;
  for (int r = 1; r < world_; ++r) pending.push_back(r);
  while (!pending.empty()) {
    std::vector<pollfd> fds;
    for (int r : pending) fds.push_back(pollfd{peers_[size_t(r)].get(), POLLIN, 0});
    // No deadline: a rank may compute for long; one that ends closes its socket and wakes the poll.
    const int n = ::poll(fds.data(), fds.size(), 1000);
    if (n < 0 && errno != EINTR) stop(std::string("poll failed: ") + std::strerror(errno));
    if (n <= 0) continue;
    std::vector<int> still;
    for (size_t i = 0; i < fds.size(); ++i) {
      const int r = pending[i];
      if (!fds[i].revents) {
        still.push_back(r);
        continue;
      }
      const int fd = peers_[size_t(r)].get();
      proc::MsgHeader h;
      if (!proc::recv_all(fd, &h, sizeof h)) rank_lost(r, during);
      if (h.type != uint32_t(proc::MsgType::Data) || h.op != uint32_t(c.op) || h.aux != c.aux ||
          h.bytes != c.send_bytes || h.seq != seq_)
        stop("rank " + std::to_string(r) + " called " + op_name(h.op) + " #" + std::to_string(h.seq) + " of " +
             std::to_string(h.bytes) + " bytes while rank 0 called " + op_name(uint32_t(c.op)) + " #" +
             std::to_string(seq_) + " of " + std::to_string(c.send_bytes) + " bytes (every rank must call the same collectives)");
      if (h.bytes > 0 && !proc::recv_all(fd, c.slot(r), size_t(h.bytes))) rank_lost(r, during);
    }
    pending = std::move(still);
  }
  c.combine();
  const proc::MsgHeader h = header(proc::MsgType::Result, uint32_t(c.op), c.aux, seq_, c.result_bytes);
  for (int r = 1; r < world_; ++r)
    if (!proc::send_msg(peers_[size_t(r)].get(), h, c.result)) rank_lost(r, during);
}

void ProcessGroup::worker_collective(Collective& c) {
  const int fd = peers_[0].get();
  const std::string lost = "rank 0 (pid " + std::to_string(peer_pids_[0]) + ") closed its connection while rank " +
                           std::to_string(rank_) + " was in " + op_name(uint32_t(c.op)) + " #" + std::to_string(seq_) +
                           ": it ended or was killed";
  const proc::MsgHeader h = header(proc::MsgType::Data, uint32_t(c.op), c.aux, seq_, c.send_bytes);
  // A failed send is not final: rank 0's reason for closing (an Abort) may still be there to read.
  proc::send_msg(fd, h, c.send);
  proc::MsgHeader r;
  if (!proc::recv_all(fd, &r, sizeof r)) stop(lost);
  if (r.type == uint32_t(proc::MsgType::Abort) || r.type == uint32_t(proc::MsgType::Bye)) {
    std::string text(std::min<uint64_t>(r.bytes, 1 << 16), '\0');
    const bool got = proc::recv_all(fd, text.data(), text.size());
    peers_[0].reset();
    if (r.type == uint32_t(proc::MsgType::Bye))
      stop("rank 0 closed the group while rank " + std::to_string(rank_) + " was in " + op_name(uint32_t(c.op)));
    broken_ = got ? text : lost;  // rank 0's own words, which name the rank that failed
    throw GroupStopped(broken_);
  }
  if (r.type != uint32_t(proc::MsgType::Result) || r.op != uint32_t(c.op) || r.seq != seq_ || r.bytes != c.result_bytes)
    stop("rank 0 answered " + std::string(op_name(uint32_t(c.op))) + " #" + std::to_string(seq_) + " with " +
         op_name(r.op) + " #" + std::to_string(r.seq) + " of " + std::to_string(r.bytes) + " bytes");
  if (r.bytes > 0 && !proc::recv_all(fd, c.result, size_t(r.bytes))) stop(lost);
}

std::vector<ProcessGroup::Ended> ProcessGroup::close(std::chrono::milliseconds timeout) {
  unwatch();  // from here the peers leave on purpose
  if (closed_) return {};
  closed_ = true;
  std::vector<Ended> ended;
  if (rank_ != 0) {
    // Rank 0's word (or its end) before this rank goes, so rank 0 never finds a worker gone early.
    if (broken_.empty() && !peers_.empty() && peers_[0]) {
      proc::MsgHeader h;
      if (proc::recv_all(peers_[0].get(), &h, sizeof h) && h.bytes > 0) {
        std::string text(std::min<uint64_t>(h.bytes, 1 << 16), '\0');
        proc::recv_all(peers_[0].get(), text.data(), text.size());
      }
    }
    peers_.clear();
    return ended;
  }
  if (broken_.empty())
    for (size_t r = 1; r < peers_.size(); ++r)
      if (peers_[r]) send_text(peers_[r].get(), proc::MsgType::Bye, "");
  peers_.clear();
  const auto deadline = Clock::now() + timeout;
  for (int r = 1; r < int(children_.size()); ++r) {
    proc::Child& ch = children_[size_t(r)];
    Ended e{r, ch.pid(), "", false};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (auto st = ch.poll(std::max(left, 0ms))) {
      e.how = proc::describe_exit(*st);
      e.clean = WIFEXITED(*st) && WEXITSTATUS(*st) == 0;
    } else {
      ch.kill_and_reap();
      e.how = "did not exit within " + ms_text(timeout) + " of the group's end and was killed";
    }
    ended.push_back(e);
  }
  return ended;
}

// The watcher's thread, its own copies of the peers' sockets (so a socket the group closes is never a
// number reused under the poll) and the pipe that stops it.
struct ProcessGroup::Watch {
  std::vector<std::pair<int, proc::Fd>> peers;  // (rank, dup of its socket)
  proc::Fd stop_read, stop_write;
  std::thread thread;
  ~Watch() {
    if (stop_write) {
      const char c = 0;
      (void)!::write(stop_write.get(), &c, 1);
    }
    if (thread.joinable()) thread.join();
  }
};

void ProcessGroup::watch(std::function<void(const std::string&)> on_lost) {
  unwatch();
  // A worker rank 0 started is killed when rank 0 ends (PR_SET_PDEATHSIG): nothing of rank 0's to
  // watch. (Rank 0 watches it, and a rank 0 that stops ends it.)
  if (dies_with_rank0_) return;
  auto w = std::make_unique<Watch>();
  for (size_t r = 0; r < peers_.size(); ++r)
    if (peers_[r]) {
      const int fd = ::fcntl(peers_[r].get(), F_DUPFD_CLOEXEC, 0);
      if (fd < 0) throw Error(std::string("tensor parallel: cannot watch the peers' sockets: ") + std::strerror(errno));
      w->peers.emplace_back(int(r), proc::Fd(fd));
    }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("tensor parallel: pipe: ") + std::strerror(errno));
  w->stop_read = proc::Fd(p[0]);
  w->stop_write = proc::Fd(p[1]);
  std::vector<pid_t> pids = peer_pids_;
  const int me = rank_;
  Watch* raw = w.get();
  w->thread = std::thread([raw, pids, me, on_lost = std::move(on_lost)] {
    std::vector<pollfd> fds;
    fds.push_back(pollfd{raw->stop_read.get(), POLLIN, 0});
    // No events asked of the sockets: poll still reports their hang-up (the peer's end) and errors.
    for (const auto& [r, fd] : raw->peers) fds.push_back(pollfd{fd.get(), 0, 0});
    for (;;) {
      const int n = ::poll(fds.data(), fds.size(), -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || fds[0].revents) return;
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents & (POLLHUP | POLLERR | POLLNVAL)) {
          const int r = raw->peers[i - 1].first;
          on_lost("tensor parallel: rank " + std::to_string(r) + " (pid " +
                  std::to_string(r < int(pids.size()) ? pids[size_t(r)] : 0) + ") ended while rank " +
                  std::to_string(me) + " was running (its connection closed)");
          return;
        }
    }
  });
  watch_ = std::move(w);
}

void ProcessGroup::unwatch() { watch_.reset(); }

ProcessGroup::~ProcessGroup() {
  unwatch();
  try {
    close(broken_.empty() ? 30s : 5s);
  } catch (...) {
    // A destructor reports nothing; Child's own destructor still kills and reaps.
  }
}

}  // namespace ingot
