// The one loader of the command line and the API: where the weights come from (a checkpoint folder,
// an engine file, or a config.json's shapes with random weights), which backend runs them, the
// checks made before anything large is read (host memory, an engine file's bounds) and before any
// GPU work (the compute capability the weights need), and the Model that binds them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "io/engine_file.h"
#include "io/engine.h"
#include "runtime/tp_engine_dir.h"
#include "runtime/model.h"

namespace ingot {

struct LoadSpec {
  // Exactly one source.
  std::string model_dir;    // a Hugging Face checkpoint folder (config.json + safetensors)
  std::string engine_path;  // an engine file from `ingot build`, or a directory from `ingot build --tp N`
  std::string config_path;  // a config.json: its shapes with seeded random weights (benchmarks)
  uint64_t random_seed = 0;
  std::string device = "auto";  // auto (the GPU when usable) | cpu | cuda
  std::string dtype;  // weights (and activations on the GPU): "" = the checkpoint's, bf16 for random ones
  // Activations and KV cache: "" = the backend's own (the weights' dtype on the GPU, f32 on the CPU);
  // "f32" on the GPU with 16-bit weights: f32 activations, residual stream and cache, the weights
  // widened in registers as the CPU does (docs/cuda-backend.md, "f32 activations with 16-bit weights").
  std::string activations;
  int threads = 0;    // CPU threads; 0 = all cores
  bool batch_invariant = false;  // GPU: batch-invariant kernels (backend.h, make_cuda_backend)
  bool verify = true;  // engine files: every blob's checksum
  // Whether the run's tensor-parallel size (RuntimeOptions::tp) was asked for: an engine directory
  // otherwise runs at its manifest's world size, and a different one asked for is refused.
  bool tp_given = false;
  // Set: a checkpoint folder's (or random) linear weights become INT4 of this group size (quant/int4.h).
  std::optional<int64_t> int4_group_size;
  // With int4_group_size: the calibration file for activation-aware scales (runtime/awq.h), text to
  // tokenize with the folder's tokenizer or whitespace-separated token ids; both empty: plain RTN.
  std::string calibration_text, calibration_ids;
  bool quantize_lm_head = false;  // with int4_group_size: the untied LM head too
  ProgressFn progress;  // engine files: bytes verified so far and in all
  const std::string& source() const;
};

// "auto" becomes cuda when a GPU is usable, else cpu; cuda in a build without CUDA is refused.
std::string resolve_device(const std::string& device);
// gpu: the CUDA device ordinal (ignored on the CPU).
std::unique_ptr<Backend> make_backend(const std::string& device, DType dtype, int threads,
                                      bool batch_invariant = false, int gpu = 0);
// --tp N on the GPU, before anything is read or allocated: a build with CUDA and NCCL, and at least N
// GPUs on this machine (one process per GPU). Error naming --tp, the GPUs needed and those there; for
// an engine directory (whose world size is its own, not a flag's) naming the directory instead.
void check_gpus_for_tensor_parallel(int tp, const std::string& engine_dir = {});

// What a load will be, decided from configs and headers only (no weight read yet).
class LoadPlan {
 public:
  explicit LoadPlan(const LoadSpec& spec);
  const ModelSpec& spec() const { return model_spec_; }
  DType weight_dtype() const { return dtype_; }
  // The dtype of activations and the KV cache: LoadSpec::activations, checked against the device and
  // the weights by the constructor.
  DType activation_dtype() const { return activation_dtype_; }
  // An engine file's header and metadata; of an engine directory, rank 0's (its spec is the whole model).
  const std::optional<EngineFileInfo>& engine_file() const { return file_; }
  // An engine directory's manifest and rank files, checked (runtime/tp_engine_dir.h).
  const std::optional<TpEngineDir>& engine_dir() const { return dir_; }
  const std::string& device() const { return device_; }
  // The GPU this process runs on: 0, or with --tp N on the GPU (after fit) this process's rank's
  // (dist/process_group.h, local_rank_from_environment: rank r on GPU r).
  int gpu() const;
  // The runtime options a run will use: an engine file's bounds applied (capacity 0 takes the
  // smaller of the default and the stored one; more than stored is refused), and the host memory the
  // run takes there checked. Call once per Model to be made, before load().
  RuntimeOptions fit(RuntimeOptions rt, bool layout_given = false) const;

 private:
  friend struct Loaded;
  LoadSpec ls_;
  ModelSpec model_spec_;
  DType dtype_ = DType::F32;
  DType activation_dtype_ = DType::F32;
  std::optional<EngineFileInfo> file_;
  std::optional<TpEngineDir> dir_;
  std::vector<int32_t> calibration_;  // [tokens] read and checked by the constructor, or empty
  // A checkpoint folder with a quantization_config (io/quantized_checkpoint.h): its group_size.
  std::optional<int64_t> published_group_;
  bool published_act_order_ = false;  // its desc_act
  std::string device_;
  // The largest --tp fit() was given (bench fits once per run, all with the same --tp): picks the GPU.
  mutable int tp_ = 1;
  // Ranks as processes (set by fit() with --tp N): this process's rank (dist/process_group.h,
  // tp_rank_from_environment), whose slice alone the process builds or loads; -1 otherwise.
  mutable int slice_rank_ = -1;
  // With slice_rank_: the weights are INT4 from a folder or random, so the process builds the whole
  // engine and keeps its share (Loaded::weights), a share not being quantizable or convertible alone.
  mutable bool whole_int4_ = false;
  std::unique_ptr<Backend> host_backend_;  // made first on the CPU: its figures join the memory check
};

// A model ready to run: the engine, the backend and (unless made later) the Model that binds them.
struct Loaded {
  // The weights; from an engine directory, or with ranks as processes, the whole model's spec with no
  // weights (they are in shards).
  std::unique_ptr<Engine> engine;
  // [world] an engine directory's rank slices; with ranks as processes [1], this process's rank's
  // slice alone (its rank file, or built by itself from the checkpoint or random weights: the whole
  // model is never in this process's memory); else empty.
  std::vector<Engine> shards;
  std::optional<EngineFileInfo> engine_file;
  std::string device;  // cpu | cuda
  std::unique_ptr<Backend> backend;
  // Ranks as processes (always with --tp N on the GPU): this process's rank, started by the first
  // make_model and shared by the later ones; between backend and model, so it goes after the Models
  // and before the backend whose stream NCCL uses.
  std::shared_ptr<RankProcess> ranks;
  std::unique_ptr<Model> model;
  double load_s = 0;  // reading, verifying or building the weights

  // Reads or builds the weights and makes the backend, after refusing a GPU the weights cannot run
  // on; no Model yet (one per fitted RuntimeOptions, made by the caller).
  static Loaded weights(LoadPlan&& plan);
  // A Model over the weights (over the shards from an engine directory) with fitted options.
  // Ranks as processes: the first call starts this process's rank (RankProcess), the later ones share it.
  std::unique_ptr<Model> make_model(const RuntimeOptions& rt);
};

// The whole load for one run: plan, fit, weights, Model.
Loaded load(const LoadSpec& spec, RuntimeOptions rt, bool layout_given = false);

}  // namespace ingot
