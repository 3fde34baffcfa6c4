#include "dist/process_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace ingot::proc {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

TempDir::TempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp && *tmp ? tmp : "/tmp";
  std::string templ = base + "/" + prefix + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  // mkdtemp makes it with mode 0700: only this user can reach the socket inside.
  if (!::mkdtemp(buf.data())) throw Error("cannot make a private directory under " + base + ": " + errno_text());
  path_ = buf.data();
}

void TempDir::remove() {
  if (path_.empty()) return;
  // The group puts only plain entries (its socket) in it, never subdirectories.
  if (DIR* d = ::opendir(path_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      ::unlink((path_ + "/" + e->d_name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path_.c_str());
  path_.clear();
}

void FileGuard::remove() {
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? " (" + std::string(name) + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

Child::Child(const Spawn& s) {
  // Everything exec needs is made before fork: between fork and exec the child of a threaded process
  // may only make async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : s.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : s.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  Fd devnull;
  if (s.stdout_to_null) {
    devnull = Fd(::open("/dev/null", O_WRONLY | O_CLOEXEC));
    if (!devnull) throw Error("cannot open /dev/null: " + errno_text());
  }
  const pid_t parent = ::getpid();
  const char* exe = s.exe.c_str();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("cannot start a process for " + s.exe + ": fork: " + errno_text());
  if (pid == 0) {
    if (s.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent ended before the line above ran
    }
    if (devnull) ::dup2(devnull.get(), STDOUT_FILENO);
    ::execve(exe, argv.data(), envp.data());
    static const char msg[] = "ingot: cannot exec the worker executable\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(127);
  }
  pid_ = pid;
}

std::optional<int> Child::poll(std::chrono::milliseconds wait) {
  if (pid_ < 0) return std::nullopt;
  if (reaped_) return status_;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      status_ = status;
      return status_;
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Child::kill_and_reap() {
  if (pid_ < 0 || reaped_) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  status_ = status;
}

std::string self_executable() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n < 0) throw Error("cannot read /proc/self/exe (this executable's path): " + errno_text());
  std::string path(buf.data(), size_t(n));
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() && path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    throw Error("this executable (" + path.substr(0, path.size() - deleted.size()) +
                ") was deleted or replaced since it started, so its workers cannot be started from it");
  return path;
}

std::vector<std::string> self_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  if (!f) throw Error("cannot read /proc/self/cmdline");
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(f, arg, '\0')) out.push_back(arg);
  return out;
}

std::vector<std::string> environment_without(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool drop = false;
    for (const auto& n : names) drop = drop || n == name;
    if (!drop) out.push_back(std::move(kv));
  }
  return out;
}

std::string random_token() {
  unsigned char b[16];
  size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("cannot read random bytes for the session token: " + errno_text());
    got += size_t(n);
  }
  static const char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s.push_back(hex[c >> 4]);
    s.push_back(hex[c & 15]);
  }
  return s;
}

bool send_msg(int fd, const MsgHeader& h, const void* payload) {
  auto send_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
      if (w < 0) throw Error("tensor parallel: sending to a rank failed: " + errno_text());
      c += w;
      n -= size_t(w);
    }
    return true;
  };
  return send_all(&h, sizeof h) && (h.bytes == 0 || send_all(payload, size_t(h.bytes)));
}

bool wait_readable(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) throw Error(std::string("tensor parallel: poll failed: ") + errno_text());
    if (r > 0) return true;
  }
}

bool recv_all(int fd, void* p, size_t n, std::optional<std::chrono::steady_clock::time_point> deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (deadline && !wait_readable(fd, *deadline)) throw Error("tensor parallel: timed out waiting for a message");
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return false;
    if (r < 0) throw Error("tensor parallel: receiving from a rank failed: " + errno_text());
    c += r;
    n -= size_t(r);
  }
  return true;
}

namespace {
sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path)
    throw Error("tensor parallel: the socket path " + path + " is " + std::to_string(path.size()) +
                " bytes, longer than a Unix socket address holds (" + std::to_string(sizeof a.sun_path - 1) +
                "); use a shorter directory");
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}
}  // namespace

Fd listen_unix(const std::string& path) {
  const sockaddr_un a = unix_address(path);
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw Error("tensor parallel: cannot make a socket: " + errno_text());
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw Error("tensor parallel: cannot make the socket " + path + ": " + errno_text());
  if (::listen(s.get(), 64) != 0) throw Error("tensor parallel: cannot listen on " + path + ": " + errno_text());
  return s;
}

Fd connect_unix(const std::string& path) {
  const sockaddr_un a = unix_address(path);
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw Error("tensor parallel: cannot make a socket: " + errno_text());
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) return Fd();
  return s;
}

}  // namespace ingot::proc
