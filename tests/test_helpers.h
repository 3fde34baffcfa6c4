// Small helpers shared by the engine tests: temporary folders and hand-made safetensors bytes.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

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
