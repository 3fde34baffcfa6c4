// The POSIX pieces the process group (dist/process_group.h) is made of, each owning what it opens:
// a file descriptor, a private temporary directory, a child process; framed messages over a Unix-domain
// stream socket; and how a child ended, in words. Kept apart from the group's protocol so each part is
// small and the tests can spawn copies of themselves with the same code.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ingot::proc {

// One file descriptor, closed when dropped.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// A directory made private (mode 0700) by mkdtemp under $TMPDIR (or /tmp), removed with whatever the
// group left in it when dropped or by remove().
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir() { remove(); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  void remove();

 private:
  std::string path_;
};

// A file that exists while this object does (unlinked when dropped or by remove()).
class FileGuard {
 public:
  FileGuard() = default;
  explicit FileGuard(std::string path) : path_(std::move(path)) {}
  ~FileGuard() { remove(); }
  FileGuard(FileGuard&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  FileGuard& operator=(FileGuard&& o) noexcept {
    if (this != &o) {
      remove();
      path_ = std::exchange(o.path_, {});
    }
    return *this;
  }
  void remove();

 private:
  std::string path_;
};

// How a child ended, from waitpid's status: "exited with code 3", "was killed by signal 9 (Killed)".
std::string describe_exit(int status);

// A child process started by fork + exec. Dropping one that is still running kills it (SIGKILL) and
// reaps it, so no path leaves a process behind.
class Child {
 public:
  struct Spawn {
    std::string exe;                        // an absolute path, exec'd as is (never looked up in PATH)
    std::vector<std::string> argv;          // argv[0] included
    std::vector<std::string> env;           // "NAME=value", the whole environment
    bool stdout_to_null = false;            // its standard output discarded (stderr stays the parent's)
    bool die_with_parent = true;            // PR_SET_PDEATHSIG: killed when the spawning thread ends
  };
  Child() = default;
  explicit Child(const Spawn& s);  // throws Error naming the executable when fork fails
  ~Child() { kill_and_reap(); }
  Child(Child&& o) noexcept : pid_(std::exchange(o.pid_, -1)), status_(o.status_), reaped_(o.reaped_) {}
  Child& operator=(Child&&) = delete;
  Child(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Reaps the child if it has ended (waiting up to `wait`); its waitpid status then, nullopt while it runs.
  std::optional<int> poll(std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  void kill_and_reap();

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// This executable's path, read from /proc/self/exe (so a worker is never found through PATH or the
// current directory); throws when it cannot be read or the file was deleted since it started.
std::string self_executable();
// This process's command line from /proc/self/cmdline (argv[0] included).
std::vector<std::string> self_command_line();
// The environment as "NAME=value" strings, without the variables whose names are listed.
std::vector<std::string> environment_without(const std::vector<std::string>& names);
// 16 random bytes from the kernel, as 32 hex digits.
std::string random_token();

// --- framed messages over a stream socket ---

enum class MsgType : uint32_t { Hello = 1, Welcome, Refused, Data, Result, Abort, Bye };

struct MsgHeader {
  uint32_t type = 0;   // MsgType
  uint32_t op = 0;     // the collective (Data, Result), or 0
  uint64_t seq = 0;    // the collective's sequence number on this connection
  uint64_t bytes = 0;  // payload bytes that follow
  uint32_t aux = 0;    // the dtype of an all-reduce, 0 otherwise
  uint32_t pad = 0;
};
static_assert(sizeof(MsgHeader) == 32);

// Writes the header and the payload (send with MSG_NOSIGNAL: a dead peer is an error, not SIGPIPE).
// Returns false when the peer is gone (EPIPE, ECONNRESET); throws Error on anything else.
bool send_msg(int fd, const MsgHeader& h, const void* payload);
// Reads exactly n bytes. Returns false on end of file or a reset (the peer closed or ended); throws
// Error when the deadline passes first (nullopt: no deadline).
bool recv_all(int fd, void* p, size_t n, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
// Waits until fd is readable (or hung up); false when the deadline passed first.
bool wait_readable(int fd, std::chrono::steady_clock::time_point deadline);

// A Unix-domain stream socket bound and listening at `path` (refused with the path named when it
// is longer than a socket address holds), close-on-exec.
Fd listen_unix(const std::string& path);
// Connects to `path`; an empty Fd with errno kept when nobody listens there (yet).
Fd connect_unix(const std::string& path);

}  // namespace ingot::proc
