#include "common.h"

#include <cstdlib>

#include <sstream>

#include "core/error.h"
#include "options.h"
#include "progress.h"

namespace ingot::cli {

void ModelArgs::add_to(CLI::App& app) {
  auto* m = app.add_option("--model", model_dir, "Hugging Face checkpoint folder (config.json + safetensors)");
  auto* e = app.add_option("--engine", engine_path, "engine file from `ingot build`, or the directory of per-rank "
                                                    "files from `ingot build --tp N` (instead of --model)");
  m->excludes(e);
  app.add_flag("--no-verify", no_verify, "skip the engine file's weight checksums (faster load)");
  app.add_flag("--quiet", quiet, "no progress bar");
  app.add_option("--device", device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", dtype, "weight dtype: fp32, fp16 or bf16 (default: the checkpoint's; on the GPU "
                                   "also the activation dtype)")
      ->check(dtype_names());
  app.add_option("--activations", activations,
                 "activation and KV-cache dtype: f32 keeps activations, the residual stream and the cache in f32 "
                 "over 16-bit weights on the GPU (decode then differs from an f32 reference by summation order "
                 "only; docs/performance.md); default: the weights' dtype on the GPU, f32 on the CPU")
      ->check(dtype_names());
  app.add_option("--threads", threads, "CPU threads (default: all cores; at most 4x the hardware threads)");
  app.add_flag("--batch-invariant", batch_invariant,
               "GPU: kernels whose result for a sequence does not depend on what else runs (identical tokens alone or "
               "in any batch, however the prompt is chunked), at a speed cost (docs/performance.md); the CPU always is");
  add_quantize_options(app, quantize, group_size, calibration, calibration_ids, quantize_lm_head);
}

void ModelArgs::add_tp_option(CLI::App& app) {
  tp_option = app.add_option("--tp", tp, "tensor-parallel ranks: the model split over N ranks (CPU: threads of this process; GPU: "
                             "one process per GPU over NCCL; docs/tensor-parallel.md); an engine directory runs at its own, which --tp must match")
      ->check(at_least(1));
}

void ModelArgs::check_tp() const {
  // On the GPU: a build with CUDA and NCCL and enough GPUs, said before anything is read (the loader
  // checks the same for the API and --device auto).
  if (tp != 1 && device == "cuda") check_gpus_for_tensor_parallel(tp);
}

void add_quantize_options(CLI::App& app, std::string& quantize, int64_t& group_size, std::string& calibration,
                          std::string& calibration_ids, bool& quantize_lm_head) {
  app.add_flag("--quantize-lm-head", quantize_lm_head, "with --quantize int4: the LM head too (untied models only; "
                                                       "the embedding always stays 16-bit)");
  app.add_option("--calibration", calibration, "with --quantize int4: a text file (tokenized with the model's "
                                               "tokenizer) for activation-aware scales (AWQ-style; docs/quantization.md)");
  app.add_option("--calibration-ids", calibration_ids, "with --quantize int4: like --calibration, a file of "
                                                       "whitespace-separated token ids (models without a tokenizer)");
  app.add_option("--quantize", quantize, "int4: the linear weights as symmetric INT4, round to nearest per group "
                                         "(docs/quantization.md); a checkpoint folder or random weights only");
  app.add_option("--group-size", group_size, "with --quantize int4: input columns per scale, a power of two in [32, 256] "
                                             "dividing every linear weight's input dimension (default 128)");
}

std::optional<int64_t> int4_group_option(const std::string& quantize, int64_t group_size) {
  if (quantize.empty()) {
    if (group_size) throw Error("--group-size " + std::to_string(group_size) + " needs --quantize int4");
    return std::nullopt;
  }
  if (quantize != "int4") throw Error("--quantize '" + quantize + "' is not supported (only int4)");
  return group_size ? group_size : kDefaultInt4Group;
}

LoadSpec ModelArgs::load_spec(const std::string& config_path, uint64_t seed) const {
  if (int(!model_dir.empty()) + int(!engine_path.empty()) + int(!config_path.empty()) != 1)
    throw Error(config_path.empty() && model_dir.empty() == engine_path.empty()
                    ? "give exactly one of --model DIR or --engine FILE"
                    : "give exactly one of --model DIR, --engine FILE or --config FILE");
  check_tp();
  LoadSpec s;
  s.model_dir = model_dir;
  s.engine_path = engine_path;
  s.config_path = config_path;
  s.random_seed = seed;
  s.device = device;
  s.dtype = dtype;
  s.activations = activations;
  s.threads = threads;
  s.batch_invariant = batch_invariant;
  s.verify = !no_verify;
  s.tp_given = tp_given();
  s.int4_group_size = int4_group_option(quantize, group_size);
  s.calibration_text = calibration;
  s.calibration_ids = calibration_ids;
  s.quantize_lm_head = quantize_lm_head;
  return s;
}

Loaded load_model(const ModelArgs& a, RuntimeOptions rt, bool layout_given) {
  LoadSpec s = a.load_spec();
  ProgressBar bar("verifying", a.quiet);
  s.progress = bar.fn();
  rt.tp = a.tp;
  return load(s, rt, layout_given);
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
