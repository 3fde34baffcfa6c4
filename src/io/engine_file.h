// Engine files (.ingot): one file holding a built Engine (runtime-layout weights), the bounds it was
// built for (max batch, capacity, cache layout), the tokenizer and chat template, generation defaults
// and provenance. Loading maps the file and verifies it; weights are used in place from the mapping.
// The byte format is specified in docs/engine-format.md.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/engine.h"
#include "io/model_config.h"
#include "models/state_layout.h"

namespace ingot {

inline constexpr char kEngineMagic[8] = {'I', 'N', 'G', 'O', 'T', 'E', 'N', 'G'};
inline constexpr uint32_t kEngineFormatVersion = 1;
inline constexpr size_t kEngineHeaderBytes = 64;
inline constexpr size_t kEngineAlignment = 256;
// Metadata above this is refused: with an embedded tokenizer it is tens of MB at most.
inline constexpr uint64_t kEngineMaxMetadataBytes = 256ull << 20;

// Called with bytes done and bytes in all, from one thread at a time.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// One file of the source checkpoint folder, hashed.
struct SourceFile {
  std::string name;  // relative to the folder
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// What the checkpoint folder brings besides the weights.
struct CheckpointExtras {
  std::string dir;
  std::vector<SourceFile> files;          // every file the build read, with its hash
  std::optional<std::string> tokenizer_json;         // tokenizer.json, verbatim
  std::optional<std::string> tokenizer_config_json;  // tokenizer_config.json, verbatim
  std::optional<std::string> special_tokens_map_json;
  std::optional<std::string> chat_template;  // chat_template.jinja, else tokenizer_config's chat_template
  nlohmann::json generation_defaults = nlohmann::json::object();  // generation_config.json
};

// The paths of the files a build reads from the checkpoint folder: config, generation config,
// tokenizer files, chat template, index and weight shards.
std::vector<std::string> checkpoint_files(const std::string& dir);

// Reads and hashes the checkpoint folder's files (progress over the bytes hashed).
CheckpointExtras describe_checkpoint(const std::string& dir, const ProgressFn& progress = {});

struct EngineBuildInfo {
  // Bounds the engine is built for; capacity 0 means the model's max_position.
  CacheBounds bounds;
  std::optional<DType> requested_dtype;  // as given to the build (recorded; the Engine's dtype is what counts)
  CheckpointExtras source;               // may be empty (engines not built from a folder)
  // One rank's slice (`ingot build --tp N`, runtime/tp_engine_dir.h): the engine's spec is then
  // rank_spec(*whole_spec, world, rank), and the file's architecture is the whole model's, so every
  // rank file describes the same model. build_id is shared by the files of one build.
  int tp_world_size = 1, tp_rank = 0;
  std::optional<ModelSpec> whole_spec;  // required when tp_world_size > 1
  std::string build_id;                 // required when tp_world_size > 1
};

struct EngineTensorRecord {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;  // absolute file offset, a multiple of kEngineAlignment
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// Everything an engine file says about itself, validated (no blob has been read yet).
struct EngineFileInfo {
  std::string path;
  uint32_t format_version = 0;
  uint64_t file_bytes = 0, metadata_bytes = 0, data_offset = 0;
  nlohmann::json metadata;  // the whole metadata document
  ModelSpec spec;  // the architecture: the whole model, also in a file holding one rank's slice
  // The spec the weights follow: spec, or for one rank's slice rank_spec(spec, tp_world_size, tp_rank).
  ModelSpec weights_spec;
  DType weight_dtype = DType::F32;
  std::optional<QuantConfig> quant;  // weights.quantization (absent: "none")
  CacheBounds bounds;  // what the engine was built for (capacity resolved)
  int tp_world_size = 1, tp_rank = 0;
  std::string tp_build_id;  // parallel.build_id: one build's rank files share it (empty for one whole engine)
  int min_cuda_major = 0, min_cuda_minor = 0;
  std::optional<std::string> tokenizer_json, tokenizer_config_json, special_tokens_map_json, chat_template;
  nlohmann::json generation_defaults;
  std::vector<EngineTensorRecord> tensors;  // in file order
};

// The KV cache description for a spec and bounds (capacity resolved): layout name, per-layer K (and V)
// shape, axis names and the axis that holds capacity (kv_shape in models/state_layout.h). Computed,
// never stored independently of the bounds.
nlohmann::json kv_cache_json(const ModelSpec& spec, const CacheBounds& bounds);

// Least CUDA compute capability the weights' dtype needs (bf16: 8.0; f16/f32: 7.0).
std::pair<int, int> min_cuda_capability(DType weight_dtype);

// Writes `engine` to `path` (through a temporary file renamed at the end, so a failed build never
// leaves a file that looks complete). Throws Error on an engine whose weights do not match its spec.
void save_engine(const Engine& engine, const EngineBuildInfo& info, const std::string& path,
                 const ProgressFn& progress = {});

// Parses and validates the header, metadata and tensor table of an engine file image of `size`
// bytes; `name` is used in errors. Reads no blob. Throws Error naming the problem.
EngineFileInfo parse_engine_file(const uint8_t* data, size_t size, const std::string& name);

// Maps `path` and parses it (no checksum of blobs is computed).
EngineFileInfo inspect_engine(const std::string& path);

struct LoadOptions {
  bool verify = true;    // xxh64 of every blob checked before the engine is returned
  int tp_world_size = 1;  // the tensor-parallel setting of this process; the file must match it
  int tp_rank = 0;
  ProgressFn progress;   // over the bytes verified
};

struct LoadedEngine {
  Engine engine;  // weights borrow the file mapping, which they keep alive
  EngineFileInfo info;
};

LoadedEngine load_engine(const std::string& path, const LoadOptions& options = {});

// Throws Error unless a device of compute capability major.minor can run the engine.
void check_device_capability(const EngineFileInfo& info, int major, int minor);
// Throws Error unless the engine was built for this tensor-parallel world size and rank.
void check_parallel(const EngineFileInfo& info, int world_size, int rank);

// xxHash64 (seed 0) as the 16 lowercase hex digits the metadata stores.
std::string xxh64_hex(uint64_t h);
// Its inverse: false unless s is exactly 16 lowercase hex digits.
bool parse_xxh64_hex(const std::string& s, uint64_t& out);
// xxHash64 (seed 0) of [p, p + n), hashed in chunks; tick (may be empty) gets each chunk's size.
uint64_t xxh64_of(const uint8_t* p, uint64_t n, const std::function<void(uint64_t)>& tick);

}  // namespace ingot
