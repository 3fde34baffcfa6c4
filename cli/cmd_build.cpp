// `ingot build`: turns a checkpoint folder into one engine file (docs/engine-format.md) holding the
// runtime-layout weights, the bounds the engine will run under, the tokenizer and the provenance; or,
// from a config.json alone, an engine of real shapes with random weights for load and speed tests.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common.h"
#include "core/error.h"
#include "core/files.h"
#include "io/quantized_checkpoint.h"
#include "models/family.h"
#include "runtime/awq.h"
#include "runtime/tp_engine_dir.h"
#include "runtime/tp_split.h"
#include "options.h"
#include "progress.h"

namespace ingot::cli {

namespace {

// "bf16", or "bf16 + int4 gptq (group 128)": what the written weights are, for the closing line.
std::string weights_text(const EngineFileInfo& f) {
  std::string t(dtype_name(f.weight_dtype));
  if (!f.quant) return t;
  const QuantConfig& q = *f.quant;
  return t + " + int4 " + (q.method == "rtn" ? std::string() : q.method + " ") + "(" +
         (q.group_size < 0 ? std::string("one group per row") : "group " + std::to_string(q.group_size)) + ")";
}

// The bounds are upper limits (runs allocate per request), so only bounds no single device could ever
// hold are refused: the least a run at the full bounds takes is its plan with activations in the
// weights' dtype (what the GPU uses), weights included.
void check_bounds_fit_a_device(const ModelSpec& spec, DType dt, const CacheBounds& bounds) {
  const MemoryPlan p = plan_memory(spec, dt, dt, RuntimeOptions{bounds});
  if (double(p.allocated()) > kLargestDeviceBytes)
    throw Error("build: a run at the bounds --max-batch " + std::to_string(bounds.max_batch) + " --capacity " +
                std::to_string(p.options.capacity) + " needs " + p.describe() + ", more than the " +
                format_bytes(kLargestDeviceBytes) + " of the largest single accelerator; choose bounds a device can hold");
}

}  // namespace

void add_build(CLI::App& app) {
  auto* cmd = app.add_subcommand("build", "Build an engine file from a checkpoint folder");
  struct Args {
    std::string model_dir, config, output, dtype, layout = "heads_first";
    uint64_t seed = 0;
    int max_batch = 1;
    int64_t capacity = 0;
    bool quiet = false, force = false;
    std::string quantize;
    int64_t group_size = 0;
    int tp = 1;
    std::string calibration, calibration_ids;
    bool quantize_lm_head = false;
  };
  auto a = std::make_shared<Args>();
  auto* m = cmd->add_option("--model", a->model_dir, "Hugging Face checkpoint folder (config.json + safetensors)");
  cmd->add_option("--config", a->config, "config.json: an engine of its shapes with seeded random weights (for "
                                         "load and speed measurements without a checkpoint)")
      ->excludes(m);
  cmd->add_option("--seed", a->seed, "random weights' seed (with --config)");
  cmd->add_option("-o,--output", a->output, "engine file to write (with --tp N > 1: the directory to write)")->required();
  cmd->add_flag("--force", a->force, "replace the output file if it exists (never an input)");
  cmd->add_option("--dtype", a->dtype, "weight dtype: fp32, fp16 or bf16 (default: the checkpoint's)")
      ->check(dtype_names());
  cmd->add_option("--max-batch", a->max_batch, "most sequences run at once (cache rows)")->check(at_least(1));
  cmd->add_option("--capacity", a->capacity,
                  "most cache slots per sequence a run may ask for (default: min(4096, max_position_embeddings); "
                  "runs allocate only what they ask for)")
      ->check(at_least(1));
  cmd->add_option("--layout", a->layout, "KV cache layout: heads_first or flattened")
      ->check(CLI::IsMember({"heads_first", "flattened"}));
  cmd->add_flag("--quiet", a->quiet, "no progress bar");
  add_quantize_options(*cmd, a->quantize, a->group_size, a->calibration, a->calibration_ids, a->quantize_lm_head);
  cmd->add_option("--tp", a->tp, "tensor-parallel ranks: with N > 1, -o names a directory that gets one engine file "
                                 "per rank and a manifest.json (docs/tensor-parallel.md)")
      ->check(at_least(1));
  cmd->callback([a] {
    EngineBuildInfo info;
    BuildOptions bo;
    if (!a->dtype.empty()) bo.dtype = info.requested_dtype = parse_dtype(a->dtype);
    if (a->model_dir.empty() == a->config.empty()) throw Error("build: give exactly one of --model DIR or --config FILE");
    const std::vector<std::string> inputs =
        a->config.empty() ? checkpoint_files(a->model_dir) : std::vector<std::string>{a->config};
    const ModelSpec spec = a->config.empty() ? load_model_spec(a->model_dir) : load_config_file(a->config);
    // The split is checked against the model before the output is touched or any weight is read.
    if (a->tp != 1) {
      check_tensor_parallel(spec, a->tp, "build --tp");
      check_engine_dir_output(a->output, a->tp, a->force, inputs);
    } else {
      check_output_path(a->output, "-o", a->force, inputs);
    }
    const DType dt = a->config.empty() ? build_dtype(a->model_dir, spec, bo.dtype) : bo.dtype.value_or(DType::BF16);
    // The group size against every linear weight before the output is touched or anything is read.
    bo.int4_group_size = int4_group_option(a->quantize, a->group_size);
    if (a->quantize_lm_head && !bo.int4_group_size) throw Error("--quantize-lm-head needs --quantize int4");
    bo.quantize_lm_head = a->quantize_lm_head;
    if (bo.int4_group_size) plan_int4(weight_table(spec), *bo.int4_group_size, "--group-size", bo.quantize_lm_head);
    // A published INT4 folder: its quantization_config checked now, before the output is touched.
    const std::optional<PublishedQuant> published =
        a->config.empty() ? read_published_quant(a->model_dir) : std::nullopt;
    if (published && bo.int4_group_size)
      throw Error("--quantize: " + a->model_dir + " is already quantized (config.json has a quantization_config); "
                  "build it without --quantize");
    // INT4 over ranks: every column cut must fall between whole groups, and act-order weights are refused
    // (the loader's rule for --tp), before anything is read.
    if (a->tp != 1) {
      const std::optional<QuantConfig> q =
          int4_split_config(spec, bo.int4_group_size, published ? std::optional<int64_t>(published->group_size) : std::nullopt,
                            published && published->act_order);
      if (q) check_int4_split(spec, *q, a->tp, "build --tp");
    }
    // The calibration tokens, read and checked against the vocabulary before the output is touched.
    std::vector<int32_t> calibration;
    if (!a->calibration.empty() || !a->calibration_ids.empty()) {
      if (!bo.int4_group_size)
        throw Error(std::string(a->calibration.empty() ? "--calibration-ids" : "--calibration") + " needs --quantize int4");
      calibration = read_calibration(a->calibration, a->calibration_ids, a->model_dir, spec.vocab);
    }
    info.bounds.max_batch = a->max_batch;
    info.bounds.capacity = a->capacity ? a->capacity : default_capacity(spec);
    info.bounds.layout = parse_layout(a->layout);
    if (a->capacity > spec.max_position)
      std::fprintf(stderr, "warning: --capacity %lld exceeds the model's max_position_embeddings %lld: positions "
                   "beyond it were not trained, output there degrades\n",
                   (long long)a->capacity, (long long)spec.max_position);
    check_bounds_fit_a_device(spec, dt, info.bounds);
    check_host_memory(spec, dt, RuntimeOptions{info.bounds}, true, nullptr);
    Engine engine;
    if (!a->config.empty()) {
      engine = random_engine(spec, dt, a->seed);
      if (bo.int4_group_size && !calibration.empty())
        quantize_engine_awq(engine, calibration, *bo.int4_group_size, "--calibration", bo.quantize_lm_head);
      else if (bo.int4_group_size) quantize_engine_int4(engine, *bo.int4_group_size, "--group-size", bo.quantize_lm_head);
      info.source.dir = "random weights (seed " + std::to_string(a->seed) + ") of the shapes in " + a->config;
    } else {
      {
        // Hashing first also pages the checkpoint in for the conversion that follows.
        ProgressBar bar("hashing", a->quiet);
        info.source = describe_checkpoint(a->model_dir, bar.fn());
      }
      ProgressBar bar("converting", a->quiet);
      bo.progress = bar.fn();
      if (bo.int4_group_size && !calibration.empty()) {  // activation-aware: built unquantized first
        BuildOptions plain = bo;
        plain.int4_group_size.reset();
        plain.quantize_lm_head = false;
        engine = build_engine(a->model_dir, plain);
        quantize_engine_awq(engine, calibration, *bo.int4_group_size, "--calibration", bo.quantize_lm_head);
      } else {
        engine = build_engine(a->model_dir, bo);
      }
    }
    if (a->tp != 1) {
      {
        ProgressBar bar("writing", a->quiet);
        save_tp_engine_dir(engine, info, a->tp, a->output, bar.fn());
      }
      const TpEngineDir d = inspect_tp_engine_dir(a->output);
      uint64_t bytes = 0;
      for (const TpRankFile& f : d.files) bytes += f.bytes;
      std::printf("wrote %s: %s split over %d ranks (%s .. %s and %s, %.2f MB in all), %s weights, max batch %d, "
                  "capacity %lld, layout %s, build %s\n",
                  a->output.c_str(), d.ranks[0].spec.family.c_str(), d.world, d.files.front().name.c_str(),
                  d.files.back().name.c_str(), kTpManifestName, double(bytes) / 1e6,
                  weights_text(d.ranks[0]).c_str(), d.ranks[0].bounds.max_batch,
                  (long long)d.ranks[0].bounds.capacity, layout_name(d.ranks[0].bounds.layout).c_str(), d.build_id.c_str());
      return;
    }
    {
      ProgressBar bar("writing", a->quiet);
      save_engine(engine, info, a->output, bar.fn());
    }
    const EngineFileInfo f = inspect_engine(a->output);
    const std::string weights = weights_text(f);
    std::printf("wrote %s: %s, %lld layers, %s weights (%.2f MB), max batch %d, capacity %lld, layout %s\n",
                a->output.c_str(), f.spec.family.c_str(), (long long)f.spec.layers, weights.c_str(), double(engine.weight_bytes()) / 1e6, f.bounds.max_batch,
                (long long)f.bounds.capacity, layout_name(f.bounds.layout).c_str());
  });
}

}  // namespace ingot::cli
