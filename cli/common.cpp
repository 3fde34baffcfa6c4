#include "common.h"

#include <sstream>

#include "core/error.h"

namespace ingot::cli {

void ModelArgs::add_to(CLI::App& app, bool require_model) {
  auto* o = app.add_option("--model", model_dir, "Hugging Face checkpoint folder (config.json + safetensors)");
  if (require_model) o->required();
  app.add_option("--device", device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", dtype, "weight dtype: fp32, fp16 or bf16 (default: the checkpoint's; on the GPU "
                                   "also the activation dtype)");
  app.add_option("--threads", threads, "CPU threads (default: all cores)");
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

Loaded load_model(const ModelArgs& a, RuntimeOptions rt) {
  Loaded l;
  BuildOptions bo;
  if (!a.dtype.empty()) bo.dtype = parse_dtype(a.dtype);
  l.engine = std::make_unique<Engine>(build_engine(a.model_dir, bo));
  const std::string dev = resolve_device(a.device);
  l.backend = make_backend(dev, l.engine->weight_dtype, a.threads);
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
