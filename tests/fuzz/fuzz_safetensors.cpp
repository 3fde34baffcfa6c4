// libFuzzer target for the safetensors reader (header length, header JSON, dtypes, shapes, offsets,
// overlaps). Two input shapes, chosen by the first byte, so the fuzzer also reaches past the length
// prefix:
//   0: the rest is a whole file image, as is;
//   1: the rest is header text, given the right length prefix and followed by a 256-byte data block.
// The file is written to memory-backed storage and opened as a user's would be; every tensor it
// accepts is read in full, so a wrong bound shows up as a sanitizer report. Any exception other than
// ingot::Error, any crash or sanitizer report is a bug.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

std::string scratch_path() {
  const std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  return (dir / ("ingot-fuzz-" + std::to_string(getpid()) + ".safetensors")).string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string path = scratch_path();
  std::string bytes;
  if (data[0] % 2 == 0) {
    bytes.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    const uint64_t n = size - 1;
    for (int i = 0; i < 8; ++i) bytes.push_back(char((n >> (8 * i)) & 0xff));
    bytes.append(reinterpret_cast<const char*>(data + 1), size - 1);
    bytes.append(256, '\x5a');
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  try {
    ingot::SafetensorsFile f(path);
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : f.tensors())
      for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
    (void)sink;
  } catch (const ingot::Error&) {
  }
  return 0;
}
