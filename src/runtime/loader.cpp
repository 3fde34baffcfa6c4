#include "runtime/loader.h"

#include <chrono>

#include "core/error.h"
#include "dist/process_group.h"
#include "io/quantized_checkpoint.h"
#include "models/family.h"
#include "runtime/awq.h"
#include "runtime/memory_plan.h"
#include "runtime/tp_group.h"
#include "runtime/tp_split.h"

#ifdef INGOT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ingot {

const std::string& LoadSpec::source() const {
  return !engine_path.empty() ? engine_path : !model_dir.empty() ? model_dir : config_path;
}

std::string resolve_device(const std::string& device) {
  if (device == "auto") {
#ifdef INGOT_WITH_CUDA
    if (cuda_available()) return "cuda";
#endif
    return "cpu";
  }
  if (device == "cuda") {
#ifndef INGOT_WITH_CUDA
    throw Error("--device cuda: this build of ingot has no CUDA backend (nvcc was not found at configure time); --device cpu runs on the CPU");
#endif
    return device;
  }
  if (device == "cpu") return device;
  throw Error("unknown device '" + device + "' (expected auto, cpu or cuda)");
}

std::unique_ptr<Backend> make_backend(const std::string& device, DType dtype, int threads, bool batch_invariant, int gpu) {
  const std::string d = resolve_device(device);  // refuses what this build cannot run
#ifdef INGOT_WITH_CUDA
  if (d == "cuda") return make_cuda_backend(dtype, gpu, batch_invariant);
#else
  (void)gpu;
  (void)dtype;
  (void)batch_invariant;  // the CPU backend is batch-invariant as it is
#endif
  return make_cpu_backend(threads);
}

namespace {

// --activations against the device and the weights. The CPU computes in f32 whatever the weights; the
// GPU in the weights' dtype, or in f32 over 16-bit weights (not INT4: its kernels take 16-bit inputs).
DType resolve_activations(const std::string& requested, const std::string& device, DType weights, bool int4) {
  if (requested.empty()) return device == "cpu" ? DType::F32 : weights;
  const DType a = parse_dtype(requested);
  const std::string flag = "--activations " + requested;
  if (device == "cpu") {
    if (a != DType::F32)
      throw Error(flag + ": the CPU backend computes activations in f32 whatever the weights; drop the flag or give f32");
    return a;
  }
  if (a == weights) return a;
  if (a != DType::F32)
    throw Error(flag + " with " + std::string(dtype_name(weights)) + " weights: the GPU runs activations in the weights' "
                "dtype or in f32 (--activations f32)");
  if (int4)
    throw Error(flag + ": the INT4 kernels take 16-bit activations; run INT4 weights without --activations");
  return a;
}

}  // namespace

LoadPlan::LoadPlan(const LoadSpec& s) : ls_(s) {
  const int sources = int(!s.model_dir.empty()) + int(!s.engine_path.empty()) + int(!s.config_path.empty());
  if (sources != 1) throw Error("give exactly one model source: a checkpoint folder, an engine file or a config.json");
  const std::optional<DType> requested = s.dtype.empty() ? std::nullopt : std::optional<DType>(parse_dtype(s.dtype));
  if (!s.engine_path.empty() && is_engine_dir(s.engine_path)) {
    dir_ = inspect_tp_engine_dir(s.engine_path);  // the manifest and every rank file's header, no weight read
    file_ = dir_->ranks[0];
  } else if (!s.engine_path.empty()) {
    file_ = inspect_engine(s.engine_path);
    if (file_->tp_world_size > 1)
      throw Error(s.engine_path + ": holds rank " + std::to_string(file_->tp_rank) + " of a model split over " +
                  std::to_string(file_->tp_world_size) + " ranks (parallel.tp_world_size): it is one slice; load the "
                  "directory that holds it and its manifest.json (--engine DIR)");
  } else if (!s.model_dir.empty()) {
    model_spec_ = load_model_spec(s.model_dir);
    dtype_ = build_dtype(s.model_dir, model_spec_, requested);
    // Its fields checked before any tensor is read.
    if (const std::optional<PublishedQuant> q = read_published_quant(s.model_dir)) {
      published_group_ = q->group_size;
      published_act_order_ = q->act_order;
    }
    if (published_group_ && s.int4_group_size)
      throw Error("--quantize: " + s.model_dir + " is already quantized (config.json has a quantization_config); "
                  "run it without --quantize");
  } else {
    model_spec_ = load_config_file(s.config_path);
    dtype_ = requested.value_or(DType::BF16);
  }
  if (file_) {  // an engine file or directory: the spec and the weight dtype were fixed at build
    model_spec_ = file_->spec;
    dtype_ = file_->weight_dtype;
    if (requested && *requested != dtype_)
      throw Error(s.engine_path + ": the engine holds " + std::string(dtype_name(dtype_)) + " weights; --dtype " +
                  s.dtype + " cannot change them (rebuild with `ingot build --dtype " + s.dtype + "`)");
  }
  // The device, and --activations against it and the weights. An explicit device's activations are
  // checked first, so a value no GPU run takes is named the same in a build without CUDA.
  const bool int4 = s.int4_group_size || published_group_ || (file_ && file_->quant);
  const bool named = s.device == "cpu" || s.device == "cuda";  // resolves to itself (or is refused)
  // The CUDA kernels take groups of a power of two from 32 values (int4_linear.cu reads 32 values of
  // one group per 16-byte load); the published formats also allow whole-row and other even groups,
  // which the build re-expresses where a power of two from 32 divides them (int4_runtime_group).
  auto check_cuda_groups = [&] {
    std::optional<int64_t> group;
    std::string what;
    if (published_group_) {  // the groups the build gives it (engine.cpp)
      group = int4_runtime_group(*published_group_, int4_quantizable_cols(weight_table(model_spec_)));
      what = s.model_dir + " (config.json: quantization_config.group_size)";
    } else if (file_ && file_->quant) {
      group = file_->quant->group_size;
      what = s.engine_path + " (weights.quantization.group_size)";
    }
    if (group && !int4_kernel_group(*group))
      throw Error("cuda backend: " + what + " has INT4 groups of " +
                  (*group < 0 ? std::string("a whole row") : std::to_string(*group) + " values") +
                  "; the CUDA kernels take powers of two in [32, 256]; run it with --device cpu");
  };
  if (named) activation_dtype_ = resolve_activations(s.activations, s.device, dtype_, int4);
  if (s.device == "cuda") check_cuda_groups();  // said the same in a build without CUDA
  device_ = resolve_device(s.device);
  if (!named) activation_dtype_ = resolve_activations(s.activations, device_, dtype_, int4);
  if (!named && device_ == "cuda") check_cuda_groups();
  // INT4: checked against the model's weights here, before any weight is read.
  if (s.int4_group_size) {
    if (!s.engine_path.empty())
      throw Error("--quantize: " + s.engine_path + " is an engine file, whose quantization was fixed when it was built "
                  "(see `ingot inspect`); quantize with `ingot build --quantize int4`");
    plan_int4(weight_table(model_spec_), *s.int4_group_size, "--group-size", s.quantize_lm_head);
  }
  if (s.quantize_lm_head && !s.int4_group_size) throw Error("--quantize-lm-head needs --quantize int4");
  // The calibration tokens: read and checked against the vocabulary now, before any weight is read.
  if (!s.calibration_text.empty() || !s.calibration_ids.empty()) {
    if (!s.int4_group_size)
      throw Error(std::string(s.calibration_text.empty() ? "--calibration-ids" : "--calibration") + " needs --quantize int4");
    calibration_ = read_calibration(s.calibration_text, s.calibration_ids, s.model_dir, model_spec_.vocab);
  }
  // The CPU backend does not depend on the weights' dtype: made first, its cache and workspace join
  // the host memory check that precedes the build or the checksum pass.
  if (device_ == "cpu") host_backend_ = make_cpu_backend(s.threads);
}

RuntimeOptions LoadPlan::fit(RuntimeOptions rt, bool layout_given) const {
  if (dir_) {
    if (ls_.tp_given && rt.tp != dir_->world)
      throw Error("--tp " + std::to_string(rt.tp) + ": " + ls_.engine_path + " holds the model split over " +
                  std::to_string(dir_->world) + " ranks (manifest.json world_size " + std::to_string(dir_->world) +
                  "); run it with --tp " + std::to_string(dir_->world) + " or without --tp, or rebuild it with `ingot "
                  "build --tp " + std::to_string(rt.tp) + "`");
    rt.tp = dir_->world;
  }
  if (rt.tp != 1) {
    const std::string flag = "--tp " + std::to_string(rt.tp);
    check_tensor_parallel(model_spec_, rt.tp);
    // The INT4 column cuts (whole groups, no act-order), before any weight is read.
    const std::optional<QuantConfig> q =
        file_ && file_->quant ? file_->quant
                              : int4_split_config(model_spec_, ls_.int4_group_size, published_group_, published_act_order_);
    if (q) check_int4_split(model_spec_, *q, rt.tp);
    if (activation_dtype_ != dtype_ && device_ == "cuda")
      throw Error(flag + " --activations " + ls_.activations + ": the ranks' GPU processes run activations in the "
                  "weights' dtype only (not implemented for f32 over 16-bit weights yet); drop one of the two");
    if (device_ == "cuda") {
      check_gpus_for_tensor_parallel(rt.tp, dir_ ? ls_.engine_path : std::string());
      tp_ranks_are_processes(true);  // refuses INGOT_TP_PROCESSES=0 (threads) here, before any weight is read
    }
    tp_ = rt.tp;
    // Ranks as processes: this process builds (or loads from an engine directory) its own rank's slice
    // alone, so its rank is read from the environment now, before the group is started (make_model).
    // A single engine file is still mapped whole and sliced at load (TpGroup::make).
    const bool own_slice = (dir_ || !file_) && tp_ranks_are_processes(device_ == "cuda");
    if (own_slice) slice_rank_ = tp_rank_from_environment(rt.tp);
    // INT4 from a folder or random weights: each rank process builds the whole INT4 engine (quantized
    // or converted as one process would) and keeps its share (shard_engine), since a share cannot be
    // quantized or converted alone; the whole INT4 model is a quarter of its 16-bit size.
    whole_int4_ = q.has_value() && own_slice && !dir_;
  }
  if (file_) rt = fit_engine_bounds(*file_, rt, layout_given);
  // With ranks as processes the host holds this rank's slice (rank_spec), not the whole model (except
  // for INT4 built whole in each process).
  check_host_memory(slice_rank_ >= 0 && !whole_int4_ ? rank_spec(model_spec_, rt.tp, slice_rank_) : model_spec_, dtype_,
                    rt, !file_, host_backend_.get());
  return rt;
}

void check_gpus_for_tensor_parallel(int tp, const std::string& engine_dir) {
  const std::string flag = engine_dir.empty() ? "--tp " + std::to_string(tp) + " --device cuda"
                                              : engine_dir + " (split over " + std::to_string(tp) + " ranks) --device cuda";
#ifndef INGOT_WITH_CUDA
  throw Error(flag + ": this build of ingot has no CUDA backend (nvcc was not found at configure time); --device cpu runs it");
#else
#ifndef INGOT_WITH_NCCL
  throw Error(flag + ": this build of ingot has no NCCL (libnccl and nccl.h were not found at configure time), which "
              "tensor parallelism on the GPU needs; --device cpu runs it");
#endif
  // One process per GPU: the rank r started by rank 0 runs on GPU r (under mpirun, its local rank's).
  const int n = cuda_device_count();
  if (n < tp)
    throw Error(flag + " needs " + std::to_string(tp) + " GPUs (one process per GPU); this machine has " +
                std::to_string(n) + (n == 0 ? " (no usable CUDA device or driver)" : "") +
                (engine_dir.empty()
                     ? "; give --tp " + (n >= 2 ? "at most " + std::to_string(n) : std::string("1")) + " or --device cpu"
                     : "; run it with --device cpu, or build a directory for fewer ranks (`ingot build --tp N`)"));
#endif
}

int LoadPlan::gpu() const {
  if (device_ != "cuda" || tp_ == 1) return 0;
#ifdef INGOT_WITH_CUDA
  // Checked by fit(): at least tp GPUs. A worker started by rank 0 has rank < tp; under mpirun the local
  // rank is the launcher's, and the modulo keeps an oversubscribed host on a GPU that exists.
  const int n = cuda_device_count();
  return n > 0 ? local_rank_from_environment() % n : 0;
#else
  return 0;
#endif
}

namespace {

// The one compute-capability rule: an engine file's recorded requirement, or for weights built here
// the same rule from their dtype. Checked before any GPU work; a GPU that cannot be queried is refused.
void check_cuda_device(const LoadPlan& plan, const std::string& source) {
  if (plan.device() != "cuda") return;
#ifdef INGOT_WITH_CUDA
  int major = 0, minor = 0;
  const int gpu = plan.gpu();
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, gpu) != cudaSuccess)
    throw Error("cannot query the compute capability of GPU " + std::to_string(gpu));
  if (plan.engine_file()) return check_device_capability(*plan.engine_file(), major, minor);
  const auto [need_major, need_minor] = min_cuda_capability(plan.weight_dtype());
  if (std::pair{major, minor} < std::pair{need_major, need_minor})
    throw Error(source + ": " + std::string(dtype_name(plan.weight_dtype())) + " weights need a GPU of compute capability " +
                std::to_string(need_major) + "." + std::to_string(need_minor) + " or newer; this GPU has " +
                std::to_string(major) + "." + std::to_string(minor));
#else
  (void)source;
#endif
}

}  // namespace

Loaded Loaded::weights(LoadPlan&& plan) {
  const LoadSpec& s = plan.ls_;
  check_cuda_device(plan, s.source());
  const auto t0 = std::chrono::steady_clock::now();
  Loaded l;
  // Ranks as processes: this process's rank's slice alone (the whole model is never in its memory).
  const int rank = plan.slice_rank_;
  const auto whole_spec_only = [&](nlohmann::json provenance) {
    l.engine = std::make_unique<Engine>();
    l.engine->spec = plan.spec();
    l.engine->weight_dtype = plan.weight_dtype();
    l.engine->provenance = std::move(provenance);
  };
  BuildOptions bo;  // a checkpoint folder's build (the whole model's or one rank's)
  if (!s.dtype.empty()) bo.dtype = parse_dtype(s.dtype);
  if (plan.dir_) {
    // Every rank file's header was checked by the plan (inspect_tp_engine_dir); with ranks as
    // processes only this rank's file is hashed and mapped.
    l.shards = load_tp_engine_dir(*plan.dir_, s.verify, s.progress, rank);
    whole_spec_only({{"engine_dir", s.engine_path}, {"build_id", plan.dir_->build_id}});
    l.engine_file = plan.file_;
  } else if (!s.engine_path.empty()) {
    LoadOptions lo;
    lo.verify = s.verify;
    lo.progress = s.progress;
    LoadedEngine le = load_engine(s.engine_path, lo);
    l.engine = std::make_unique<Engine>(std::move(le.engine));
    l.engine_file = std::move(le.info);
  } else if (rank >= 0 && !plan.whole_int4_ && !s.model_dir.empty()) {
    l.shards.push_back(build_rank_engine(s.model_dir, bo, plan.tp_, rank));
    whole_spec_only(l.shards[0].provenance);
  } else if (rank >= 0 && !plan.whole_int4_) {
    l.shards.push_back(random_rank_engine(plan.spec(), plan.weight_dtype(), s.random_seed, plan.tp_, rank));
    whole_spec_only(l.shards[0].provenance);
  } else if (!s.model_dir.empty()) {
    const bool awq = s.int4_group_size && !plan.calibration_.empty();
    if (!awq) {  // activation-aware: built unquantized, the scales searched on it, then quantized
      bo.int4_group_size = s.int4_group_size;
      bo.quantize_lm_head = s.quantize_lm_head;
    }
    l.engine = std::make_unique<Engine>(build_engine(s.model_dir, bo));
    if (awq) quantize_engine_awq(*l.engine, plan.calibration_, *s.int4_group_size, "--calibration", s.quantize_lm_head);
  } else {
    l.engine = std::make_unique<Engine>(random_engine(plan.spec(), plan.weight_dtype(), s.random_seed));
    if (s.int4_group_size && !plan.calibration_.empty())
      quantize_engine_awq(*l.engine, plan.calibration_, *s.int4_group_size, "--calibration", s.quantize_lm_head);
    else if (s.int4_group_size) quantize_engine_int4(*l.engine, *s.int4_group_size, "--group-size", s.quantize_lm_head);
  }
  // INT4 over rank processes: this rank's share of the whole engine built above (which stays in l.engine:
  // the share borrows its replicated weights).
  if (rank >= 0 && plan.whole_int4_) l.shards.push_back(shard_engine(*l.engine, plan.tp_, rank));
  l.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  l.device = plan.device();
  l.backend = plan.host_backend_ ? std::move(plan.host_backend_) : make_backend(l.device, plan.activation_dtype(), s.threads,
                                                                                     s.batch_invariant, plan.gpu());
  return l;
}

Loaded load(const LoadSpec& spec, RuntimeOptions rt, bool layout_given) {
  LoadPlan plan(spec);
  rt = plan.fit(rt, layout_given);
  Loaded l = Loaded::weights(std::move(plan));
  l.model = l.make_model(rt);
  return l;
}

std::unique_ptr<Model> Loaded::make_model(const RuntimeOptions& rt) {
  // Ranks as processes: the group is started with the first Model and serves every later one.
  if (rt.tp > 1 && !ranks && tp_ranks_are_processes(device == "cuda")) ranks = RankProcess::start(rt.tp, *backend);
  if (!shards.empty()) return std::make_unique<Model>(shards, *backend, rt, ranks);
  return std::make_unique<Model>(*engine, *backend, rt, ranks);
}

}  // namespace ingot
