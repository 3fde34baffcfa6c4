// safetensors reading (memory-mapped, strictly validated) and writing, plus a Hugging Face checkpoint
// folder that is either one model.safetensors or shards listed by model.safetensors.index.json.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace ingot {

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  const uint8_t* data;  // inside the file mapping
  size_t nbytes;
  TensorView view() const { return {dtype, shape, data}; }
};

class SafetensorsFile {
 public:
  // Header length above this is refused: real headers are a few MB even for 100k-tensor files.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  explicit SafetensorsFile(const std::string& path);  // throws Error naming the file and tensor
  const std::string& path() const { return map_.path(); }
  const TensorEntry* find(const std::string& name) const;
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile map_;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (in name order) with an optional __metadata__ block.
void write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);  // throws Error naming the folder / index / shard
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor, or an Error naming the tensor and the folder.
  const TensorEntry& get(const std::string& name) const;
  std::vector<std::string> names() const;
  // Every file whose bytes form the checkpoint (for hashing into engine metadata).
  std::vector<std::string> files() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorEntry*> index_;
};

}  // namespace ingot
