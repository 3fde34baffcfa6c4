// safetensors format: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data block.
// Every rule of the format is checked before a byte of tensor data is trusted.
#include "io/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/files.h"

namespace ingot {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool parse_st_dtype(const std::string& s, DType& out) {
  if (s == "F32") out = DType::F32;
  else if (s == "F16") out = DType::F16;
  else if (s == "BF16") out = DType::BF16;
  else if (s == "I32") out = DType::I32;
  else if (s == "I64") out = DType::I64;
  else if (s == "I8") out = DType::I8;  // compressed-tensors zero points of releases before 0.10
  else return false;
  return true;
}

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
  }
  return "?";
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
  const std::string where = path + ": ";
  const size_t size = map_.size();
  if (size < 8) throw Error(where + "file of " + std::to_string(size) + " bytes is too short for a safetensors header");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | map_.data()[i];
  if (hlen > kMaxHeaderBytes)
    throw Error(where + "header length " + std::to_string(hlen) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes");
  if (hlen > size - 8)
    throw Error(where + "header length " + std::to_string(hlen) + " runs past the end of the file (" +
                std::to_string(size) + " bytes)");
  json header;
  try {
    header = json::parse(map_.data() + 8, map_.data() + 8 + hlen);
  } catch (const json::exception& e) {
    throw Error(where + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(where + "header is not a JSON object");

  const uint8_t* base = map_.data() + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) throw Error(where + "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw Error(where + "__metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string tw = where + "tensor '" + name + "': ";
    const json& e = *it;
    if (!e.is_object()) throw Error(tw + "entry is not an object");
    if (!e.contains("dtype") || !e["dtype"].is_string()) throw Error(tw + "missing string field 'dtype'");
    DType dt;
    if (!parse_st_dtype(e["dtype"].get<std::string>(), dt))
      throw Error(tw + "unsupported dtype '" + e["dtype"].get<std::string>() + "' (supported: F32, F16, BF16, I32, I64)");
    if (!e.contains("shape") || !e["shape"].is_array()) throw Error(tw + "missing array field 'shape'");
    Shape shape;
    unsigned __int128 count = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw Error(tw + "shape has a non-integer or negative dimension");
      uint64_t v = d.get<uint64_t>();
      count *= v;
      if (count > (unsigned __int128)(uint64_t(1) << 62)) throw Error(tw + "shape is absurdly large");
      shape.push_back(int64_t(v));
    }
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2 ||
        !e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned())
      throw Error(tw + "data_offsets must be two non-negative integers");
    uint64_t b = e["data_offsets"][0].get<uint64_t>(), en = e["data_offsets"][1].get<uint64_t>();
    if (b > en) throw Error(tw + "data_offsets begin " + std::to_string(b) + " > end " + std::to_string(en));
    if (en > data_size)
      throw Error(tw + "data_offsets end " + std::to_string(en) + " lies outside the data block of " +
                  std::to_string(data_size) + " bytes");
    uint64_t expect = uint64_t(count) * dtype_size(dt);
    if (en - b != expect)
      throw Error(tw + "byte length " + std::to_string(en - b) + " does not match dtype " + st_dtype_name(dt) +
                  " x shape " + shape_str(shape) + " = " + std::to_string(expect) + " bytes");
    ranges.emplace_back(b, en);
    tensors_.emplace(name, TensorEntry{name, dt, shape, base + b, size_t(en - b)});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      std::string a, c;
      for (auto& [n, t] : tensors_) {
        uint64_t off = uint64_t(t.data - base);
        if (off == ranges[i - 1].first && t.nbytes == ranges[i - 1].second - ranges[i - 1].first) a = n;
        if (off == ranges[i].first && t.nbytes == ranges[i].second - ranges[i].first) c = n;
      }
      throw Error(where + "tensors '" + a + "' and '" + c + "' overlap in the data block");
    }
  }
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& [name, v] : tensors) {
    header[name] = {{"dtype", st_dtype_name(v.dtype)}, {"shape", v.shape}, {"data_offsets", {off, off + v.nbytes()}}};
    off += v.nbytes();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';  // keep the data block 8-byte aligned, as the reference writer does
  OutputFile out(path);
  uint64_t n = h.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(h.data(), h.size());
  for (auto& [name, v] : tensors) out.write(v.data, v.nbytes());
  out.commit();
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) throw Error(dir + ": not a checkpoint folder (does not exist or is not a directory)");
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index_path)) {
    json idx;
    const std::string text = read_file(index_path.string());
    try {
      idx = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(index_path.string() + ": not valid JSON: " + e.what());
    }
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw Error(index_path.string() + ": missing object 'weight_map'");
    std::map<std::string, size_t> shard_of_file;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string()) throw Error(index_path.string() + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string file = it->get<std::string>();
      if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
        throw Error(index_path.string() + ": shard name '" + file + "' must be a plain file name in the folder");
      auto [pos, inserted] = shard_of_file.emplace(file, shards_.size());
      if (inserted) shards_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
      const TensorEntry* e = shards_[pos->second]->find(it.key());
      if (!e)
        throw Error(index_path.string() + ": tensor '" + it.key() + "' is listed in shard '" + file +
                    "' but that file does not contain it");
      index_[it.key()] = e;
    }
  } else if (fs::exists(single)) {
    shards_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (auto& [n, e] : shards_.back()->tensors()) index_[n] = &e;
  } else {
    throw Error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
}

const TensorEntry& Checkpoint::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(dir_ + ": required tensor '" + name + "' is missing from the checkpoint");
  return *it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, e] : index_) out.push_back(n);
  return out;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (auto& s : shards_) out.push_back(s->path());
  return out;
}

}  // namespace ingot
