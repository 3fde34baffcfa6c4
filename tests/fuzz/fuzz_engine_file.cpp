// libFuzzer target for the engine file parser (header, metadata JSON, tensor table). Three input
// shapes, chosen by the first byte, so the fuzzer reaches past the checksums:
//   0: the rest is a whole file image, as is;
//   1: the rest is metadata text, wrapped in a well-formed header with the right length and checksum;
//   2: a valid engine's metadata with one node replaced: the next bytes pick a path down the JSON
//      tree (one byte per level, 0xff stops), the remainder is the replacement (JSON, else a string).
// Any exception other than ingot::Error, any crash or sanitizer report is a bug.
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/engine_file.h"

namespace {

using nlohmann::json;
using Bytes = std::vector<uint8_t>;

void put_u64(Bytes& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i));
}
uint64_t get_u64(const Bytes& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[at + size_t(i)];
  return v;
}

// A small valid engine (random weights) as the baseline for shapes 1 and 2.
struct Baseline {
  Bytes file;
  json metadata;
  uint64_t data_offset = 0;
  Baseline() {
    ingot::ModelSpec s;
    s.family = "qwen3";
    s.vocab = 64;
    s.hidden = 16;
    s.intermediate = 32;
    s.layers = 2;
    s.heads = 2;
    s.kv_heads = 1;
    s.head_dim = 8;
    s.max_position = 32;
    s.qk_norm = true;
    s.window = {0, 0};
    s.eos_ids = {1};
    ingot::EngineBuildInfo info;
    info.bounds.max_batch = 2;
    const std::string path = (std::filesystem::temp_directory_path() / "ingot-fuzz-baseline.ingot").string();
    ingot::save_engine(ingot::random_engine(s, ingot::DType::F32, 1), info, path);
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::filesystem::remove(path);
    const uint64_t mlen = get_u64(file, 16);
    data_offset = get_u64(file, 32);
    metadata = json::parse(file.begin() + 64, file.begin() + 64 + long(mlen));
  }
  // The baseline file with its metadata replaced by `text` (header fixed up to match it).
  Bytes with_metadata(const std::string& text) const {
    const uint64_t room = data_offset - 64;
    const uint64_t grow = text.size() > room ? (text.size() - room + 255) / 256 * 256 : 0;
    Bytes out(file.begin(), file.begin() + 64);
    put_u64(out, 16, text.size());
    put_u64(out, 24, XXH64(text.data(), text.size(), 0));
    put_u64(out, 32, data_offset + grow);
    put_u64(out, 40, file.size() + grow);
    out.insert(out.end(), text.begin(), text.end());
    out.resize(data_offset + grow, 0);
    out.insert(out.end(), file.begin() + long(data_offset), file.end());
    return out;
  }
};

const Baseline& baseline() {
  static const Baseline b;
  return b;
}

void parse(const Bytes& image) {
  try {
    ingot::parse_engine_file(image.data(), image.size(), "fuzz.ingot");
  } catch (const ingot::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  baseline();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  ++data;
  --size;
  if (mode == 0) {
    parse(Bytes(data, data + size));
  } else if (mode == 1) {
    parse(baseline().with_metadata(std::string(reinterpret_cast<const char*>(data), size)));
  } else {
    json m = baseline().metadata;
    json* node = &m;
    size_t i = 0;
    for (; i < size && data[i] != 0xff && (node->is_object() || node->is_array()) && !node->empty(); ++i) {
      const size_t k = data[i] % node->size();
      if (node->is_array()) {
        node = &(*node)[k];
      } else {
        auto it = node->begin();
        std::advance(it, long(k));
        node = &it.value();
      }
    }
    if (i < size && data[i] == 0xff) ++i;
    const std::string rest(reinterpret_cast<const char*>(data + i), size - i);
    json value = json::parse(rest, nullptr, /*allow_exceptions=*/false);
    *node = value.is_discarded() ? json(rest) : std::move(value);
    std::string text;
    try {
      text = m.dump();
    } catch (const json::exception&) {
      return 0;  // the replacement string was not UTF-8; nothing a writer could produce
    }
    parse(baseline().with_metadata(text));
  }
  return 0;
}
