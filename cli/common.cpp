#include "common.h"

#include <sstream>

#include "core/error.h"
#include "options.h"
#include "progress.h"

#ifdef INGOT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ingot::cli {

void ModelArgs::add_to(CLI::App& app) {
  auto* m = app.add_option("--model", model_dir, "Hugging Face checkpoint folder (config.json + safetensors)");
  auto* e = app.add_option("--engine", engine_path, "engine file from `ingot build` (instead of --model)");
  m->excludes(e);
  app.add_flag("--no-verify", no_verify, "skip the engine file's weight checksums (faster load)");
  app.add_flag("--quiet", quiet, "no progress bar");
  app.add_option("--device", device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", dtype, "weight dtype: fp32, fp16 or bf16 (default: the checkpoint's; on the GPU "
                                   "also the activation dtype)")
      ->check(dtype_names());
  app.add_option("--threads", threads, "CPU threads (default: all cores; at most 4x the hardware threads)");
}

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
#ifdef INGOT_WITH_CUDA
  if (cuda_available()) return "cuda";
#endif
  return "cpu";
}

std::unique_ptr<Backend> make_backend(const std::string& device, DType dtype, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
#ifdef INGOT_WITH_CUDA
  if (device == "cuda") return make_cuda_backend(dtype);
#else
  (void)dtype;
  if (device == "cuda") throw Error("this build of ingot has no CUDA backend (nvcc was not found at configure time)");
#endif
  throw Error("unknown device '" + device + "'");
}

EngineSource open_engine(const ModelArgs& a) {
  if (a.model_dir.empty() == a.engine_path.empty()) throw Error("give exactly one of --model DIR or --engine FILE");
  EngineSource src;
  if (a.engine_path.empty()) {
    BuildOptions bo;
    if (!a.dtype.empty()) bo.dtype = parse_dtype(a.dtype);
    src.engine = std::make_unique<Engine>(build_engine(a.model_dir, bo));
    return src;
  }
  LoadOptions lo;
  lo.verify = !a.no_verify;
  ProgressBar bar("verifying", a.quiet);
  lo.progress = bar.fn();
  LoadedEngine le = load_engine(a.engine_path, lo);
  if (!a.dtype.empty() && parse_dtype(a.dtype) != le.engine.weight_dtype)
    throw Error(a.engine_path + ": the engine holds " + std::string(dtype_name(le.engine.weight_dtype)) +
                " weights; --dtype " + a.dtype + " cannot change them (rebuild with `ingot build --dtype " + a.dtype + "`)");
  src.engine = std::make_unique<Engine>(std::move(le.engine));
  src.file = std::move(le.info);
  return src;
}

RuntimeOptions fit_engine_bounds(const EngineSource& src, RuntimeOptions rt, bool layout_given) {
  return src.file ? fit_engine_bounds(*src.file, rt, layout_given) : rt;
}

void check_before_loading(const ModelArgs& a, const RuntimeOptions& rt, bool layout_given, const Backend* host_backend) {
  if (!a.engine_path.empty()) {
    const EngineFileInfo info = inspect_engine(a.engine_path);
    check_host_memory(info.spec, info.weight_dtype, fit_engine_bounds(info, rt, layout_given), false, host_backend);
  } else if (!a.model_dir.empty()) {
    const ModelSpec spec = load_model_spec(a.model_dir);
    std::optional<DType> dt;
    if (!a.dtype.empty()) dt = parse_dtype(a.dtype);
    check_host_memory(spec, build_dtype(a.model_dir, spec, dt), rt, true, host_backend);
  }
}

void check_device(const EngineSource& src, const std::string& device) {
  if (!src.file || device != "cuda") return;
#ifdef INGOT_WITH_CUDA
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    throw Error("cannot query the compute capability of GPU 0");
  check_device_capability(*src.file, major, minor);
#endif
}

Loaded load_model(const ModelArgs& a, RuntimeOptions rt, bool layout_given) {
  const std::string dev = resolve_device(a.device);
  // The CPU backend does not depend on the weights' dtype: made first, its figures join the check.
  std::unique_ptr<Backend> host_backend = dev == "cpu" ? make_cpu_backend(a.threads) : nullptr;
  check_before_loading(a, rt, layout_given, host_backend.get());
  EngineSource src = open_engine(a);
  rt = fit_engine_bounds(src, rt, layout_given);
  check_device(src, dev);
  Loaded l;
  l.engine = std::move(src.engine);
  l.engine_file = std::move(src.file);
  l.backend = host_backend ? std::move(host_backend) : make_backend(dev, l.engine->weight_dtype, a.threads);
  l.model = std::make_unique<Model>(*l.engine, *l.backend, rt);
  return l;
}

std::vector<int32_t> parse_ids(const std::string& csv) {
  std::vector<int32_t> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument("");
      out.push_back(int32_t(v));
    } catch (const std::exception&) {
      throw Error("'" + item + "' is not a token id (expected non-negative integers separated by commas)");
    }
  }
  return out;
}

std::vector<int> parse_int_list(const std::string& csv) {
  std::vector<int> out;
  for (int32_t v : parse_ids(csv)) out.push_back(v);
  return out;
}

}  // namespace ingot::cli
