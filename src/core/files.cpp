#include "core/files.h"

#include <filesystem>
#include <utility>

namespace ingot {

namespace {
std::string folder_of(const std::string& path) {
  const std::string f = std::filesystem::path(path).parent_path().string();
  return f.empty() ? "." : f;
}
}  // namespace

void check_output_path(const std::string& path, const std::string& flag, bool force,
                       const std::vector<std::string>& inputs) {
  if (path.empty()) throw Error(flag + ": the output path is empty");
  const std::string what = flag + " " + path + ": ";
  const std::string folder = folder_of(path);
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0)
    throw Error(what + "cannot write in folder " + folder + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw Error(what + folder + " is not a directory");
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw Error(what + "is a directory; name the file to write");
    // By identity, not by name: a symlink or hard link to an input, or another spelling of its path,
    // is the input too.
    for (const std::string& in : inputs) {
      struct stat is {};
      if (::stat(in.c_str(), &is) == 0 && is.st_dev == st.st_dev && is.st_ino == st.st_ino)
        throw Error(what + "is the same file as " + in + ", an input of this command; write the output elsewhere " +
                    "(--force never replaces an input)");
    }
    if (!force) throw Error(what + "the file exists; pass --force to replace it");
  } else if (errno != ENOENT) {
    throw Error(what + std::strerror(errno));
  }
  try {
    OutputFile probe(path);  // proves the folder writable now, not after the work; removed unused
  } catch (const Error& e) {
    throw Error(flag + " " + e.what());
  }
}

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  // O_EXCL on a name of our own: never follows a planted symlink, never truncates another writer's file.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    tmp_ = path_ + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(attempt);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 99))
      throw Error(path_ + ": cannot write in folder " + folder_of(path_) + ": " + std::strerror(errno));
  }
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(path_ + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

void OutputFile::commit() {
  // fsync before the rename: after a crash the final name holds the old file or the whole new one.
  if (::fsync(fd_) != 0) throw Error(path_ + ": write failed: " + std::strerror(errno));
  const int rc = ::close(std::exchange(fd_, -1));
  if (rc != 0) throw Error(path_ + ": write failed: " + std::strerror(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw Error(path_ + ": cannot move the finished file into place: " + std::strerror(errno));
  tmp_.clear();
}

}  // namespace ingot
