// MemoryPlan: every byte a Model will allocate (weights, KV cache, workspace), computed from the spec
// and the runtime options before anything is allocated. The Model sizes its buffers from the plan, so
// the estimate a command checks against free memory is what the run then takes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "io/model_config.h"

namespace ingot {

enum class CacheLayout { HeadsFirst, Flattened };
std::string layout_name(CacheLayout l);
CacheLayout parse_layout(const std::string& s);

struct RuntimeOptions {
  int max_batch = 1;          // cache rows
  int64_t capacity = 0;       // cache slots per row; 0 = default_capacity(spec)
  CacheLayout layout = CacheLayout::HeadsFirst;
  int64_t max_tokens = 0;     // most tokens one forward may carry; 0 = min(max_batch * capacity, 4096)
  int64_t max_logit_rows = 0; // logits rows computed per LM-head pass; 0 = max(max_batch, 64)
  bool use_graphs = true;     // capture decode steps as graphs where the backend supports it
};

// Limits on runtime options: cache rows and slots are indexed with int32 on every backend, and no
// larger figure is a real request (an engine file's bounds are held to the same limits).
constexpr int kMaxRuntimeBatch = 1 << 20;
constexpr int64_t kMaxRuntimeCapacity = int64_t(1) << 30;

// Cache slots a run gets when it names none, and the capacity `ingot build` stores by default: long
// enough for a conversation, while max_position_embeddings (40960 for Qwen3, 131072 for Llama 3.1)
// would cost gigabytes of cache per row that a short request never touches.
constexpr int64_t kDefaultCapacity = 4096;
int64_t default_capacity(const ModelSpec& spec);

// The largest memory of one accelerator that ingot could run on: 288 GB (NVIDIA B300 and AMD MI355X
// HBM, the most any single card carries). Engine bounds whose weights + cache exceed it could never
// be run on one device, so the build refuses them.
constexpr double kLargestDeviceBytes = 288e9;

// Bytes of each workspace buffer (see Model).
struct WorkspacePlan {
  size_t hidden = 0;        // each of x, h and delta: [max_tokens, hidden]
  size_t qkv = 0, attn = 0, gate_up = 0, act = 0;
  size_t token_meta = 0;    // each of the six int32 [max_tokens] metadata arrays
  size_t gathered = 0, logits = 0;  // [max_logit_rows, hidden] and [max_logit_rows, vocab]
  size_t next_tokens = 0, sample_params = 0, sample_step = 0, sample_seen = 0;  // per cache row
  size_t inv_freq = 0;
  size_t total() const;
};

struct MemoryPlan {
  RuntimeOptions options;   // with every 0 default resolved
  DType activation_dtype = DType::F32;
  size_t weights = 0;       // the engine's weights
  bool weights_in_place = false;  // the backend reads the engine's host copy and allocates none
  size_t cache_per_layer = 0;     // one layer's K (and again its V)
  size_t cache = 0;
  WorkspacePlan ws;
  size_t workspace = 0;

  // What the backend allocates: weights unless used in place, the cache and the workspace.
  size_t allocated() const { return (weights_in_place ? 0 : weights) + cache + workspace; }
  // "4.69 GB (weights 1.19 GB, KV cache 3.36 GB for max batch 1 x capacity 40960, workspace 0.14 GB)"
  std::string describe() const;
};

// Bytes of the runtime-layout weights (runtime_weight_shapes) of `spec` in `dtype`.
size_t engine_weight_bytes(const ModelSpec& spec, DType dtype);

// Resolves the options' defaults, refuses options no run could use (each limit named) and sums what a
// Model over these will allocate. Throws Error when a figure exceeds the 64-bit address space.
MemoryPlan plan_memory(const ModelSpec& spec, DType weight_dtype, DType activation_dtype, const RuntimeOptions& options,
                       bool weights_in_place = false);

// Throws Error with both figures (what `plan` needs, broken into weights, cache and workspace, and
// what `where` has free) when it does not fit; does nothing when `available` is unknown.
void check_fits(const MemoryPlan& plan, std::optional<size_t> available, const std::string& where);
// The same for a bare byte count (e.g. an engine's weights about to be built in host memory).
void check_fits(size_t needed, const std::string& what, std::optional<size_t> available, const std::string& where);

class Backend;
struct EngineFileInfo;

// The weight dtype build_engine gives the checkpoint folder `dir` (spec read from it): `requested`,
// else config.json's torch_dtype, else the dtype of the checkpoint's first weight.
DType planned_build_dtype(const std::string& dir, const ModelSpec& spec, std::optional<DType> requested);

// Before an engine exists: refuses (Error with both figures) when the host cannot hold what the run
// will take there: the weights when they are built into host memory (`weights_built`: a checkpoint
// or random weights; an engine file is mapped), and, when `host_backend` is given (a backend working
// in host memory), everything the Model allocates.
void check_host_memory(const ModelSpec& spec, DType weight_dtype, const RuntimeOptions& rt, bool weights_built,
                       const Backend* host_backend);

// A run on an engine file: the request's own capacity and batch, refused with both figures when above
// the stored bounds (or, when layout_given, another layout); capacity 0 takes
// min(default_capacity(spec), the stored capacity). The cache is then sized for the request, never
// for the bounds.
RuntimeOptions fit_engine_bounds(const EngineFileInfo& f, RuntimeOptions request, bool layout_given);

// Host memory the kernel could hand out now without swapping (MemAvailable of /proc/meminfo);
// unknown where the file is absent.
std::optional<size_t> host_available_bytes();

// "1.19 GB" (decimal units, as memory figures are quoted on cards), or MB / bytes below that.
std::string format_bytes(double bytes);

}  // namespace ingot
