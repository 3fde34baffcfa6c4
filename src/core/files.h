// Files the user names: read with errors that say what is wrong with the path (a folder where a file
// is expected, a missing file, the system's reason), and outputs written so that no input is ever
// destroyed and a failed write never leaves a half file under the final name.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace ingot {

// The reason opening `path` for reading failed with errno `err`, as "<path>: <reason>". Inline (as is
// read_file) so the text library, which links nothing of the engine, reads files the same way.
inline std::string read_error(const std::string& path, int err) {
  if (err == ENOENT) return path + ": does not exist";
  if (err == EISDIR) return path + ": is a directory, not a file";
  return path + ": cannot read: " + std::strerror(err);
}

// Opens `path` read-only, refusing a directory (pipes and devices such as /dev/stdin are read as
// files). Returns the descriptor; throws Error naming the path and the reason.
inline int open_for_reading(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(read_error(path, errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(read_error(path, e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw Error(read_error(path, EISDIR));
  }
  return fd;
}

// The whole content of `path` (a regular file, a pipe or a device).
inline std::string read_file(const std::string& path) {
  const int fd = open_for_reading(path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      throw Error(read_error(path, e));
    }
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

// Refuses, before any long work, an output that cannot or must not be written: `path` is a directory;
// its folder is missing, not a directory or not writable (found by creating a file there); it is one
// of `inputs` (same file by identity: also through a symlink or a hard link), even with `force`; or it
// exists and `force` is false. `flag` names the option in the messages (e.g. "-o").
void check_output_path(const std::string& path, const std::string& flag, bool force,
                       const std::vector<std::string>& inputs);

// An output written to a temporary file beside `path` and renamed onto it by commit(), so readers
// never see a partial file and an existing file stays intact until the new one is complete.
class OutputFile {
 public:
  explicit OutputFile(std::string path);  // creates the temporary file; throws Error naming the folder and why
  ~OutputFile();                          // removes the temporary file unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);  // throws Error with the reason (e.g. no space left)
  void commit();                           // flushes, closes and renames onto the final path

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace ingot
