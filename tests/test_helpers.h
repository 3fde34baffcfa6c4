// Small helpers shared by the engine tests: temporary folders and hand-made safetensors bytes.
#pragma once
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>

#include "core/error.h"

namespace ingot::test {

inline std::string fixture(const std::string& name) {
  return std::string(INGOT_SOURCE_DIR) + "/tests/data/models/" + name;
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("ingot-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& n) const { return (path_ / n).string(); }

 private:
  std::filesystem::path path_;
};

// Runs a shell command, returning its exit status (-1 when it did not exit normally) and its
// stdout+stderr.
inline std::pair<int, std::string> sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}
// A path or argument single-quoted for the shell (none of ours holds a quote).
inline std::string q(const std::string& s) { return "'" + s + "'"; }

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from a header string and a data block, with the length prefix as given.
inline std::string st_bytes(const std::string& header, const std::string& data, uint64_t declared_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((declared_len >> (8 * i)) & 0xff);
  return out + header + data;
}
inline std::string st_bytes(const std::string& header, const std::string& data) {
  return st_bytes(header, data, header.size());
}

// Asserts that `fn` throws ingot::Error whose message contains every fragment.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected an ingot::Error";
  } catch (const Error& e) {
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
        << "message '" << e.what() << "' lacks '" << f << "'";
  }
}

}  // namespace ingot::test
