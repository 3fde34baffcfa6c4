// What every subcommand shares: where the model comes from, which backend runs it, and how errors
// reach the user.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/loader.h"

namespace ingot::cli {

struct ModelArgs {
  std::string model_dir;  // --model
  std::string engine_path;  // --engine (an engine file from `ingot build`), the alternative to --model
  std::string device = "auto";  // --device auto|cpu|cuda
  std::string dtype;      // --dtype (weights and, on the GPU, activations)
  std::string activations;  // --activations f32: f32 activations and cache over 16-bit weights on the GPU
  int threads = 0;        // --threads (CPU)
  bool batch_invariant = false;  // --batch-invariant: GPU kernels whose results do not depend on the batch
  bool no_verify = false;  // --no-verify: skip the engine file's blob checksums
  bool quiet = false;      // --quiet: no progress bar
  std::string quantize;    // --quantize int4: a checkpoint folder's linear weights as INT4 (round to nearest)
  int64_t group_size = 0;  // --group-size (0: not given; kDefaultInt4Group)
  int tp = 1;              // --tp: tensor-parallel ranks (docs/tensor-parallel.md)
  CLI::Option* tp_option = nullptr;  // set by add_tp_option: whether --tp was given (an engine directory's own otherwise)
  std::string calibration, calibration_ids;  // --calibration FILE (text) / --calibration-ids FILE
  bool quantize_lm_head = false;             // --quantize-lm-head
  // Commands that run a model need exactly one of --model / --engine (checked by load_spec).
  void add_to(CLI::App& app);
  // --tp, on the commands tensor parallelism is tested on (check, generate, bench, chat, serve); the
  // others run one rank, or an engine directory's world size, and do not offer it.
  void add_tp_option(CLI::App& app);
  bool tp_given() const { return tp_option && tp_option->count() > 0; }
  const std::string& source_name() const { return engine_path.empty() ? model_dir : engine_path; }
  // What the runtime's loader needs (no progress callback). config_path: bench's --config (random
  // weights of its shapes, seeded by `seed`), the third source where a command offers it.
  LoadSpec load_spec(const std::string& config_path = {}, uint64_t seed = 0) const;
  // --tp N --device cuda: refuses a build without CUDA or NCCL and a machine with fewer than N GPUs,
  // before anything is read; the rest of --tp is checked against the model by the loader (LoadPlan::fit).
  void check_tp() const;
};

// The run's model through the runtime's loader (runtime/loader.h), with a progress bar over an engine
// file's checksums.
Loaded load_model(const ModelArgs& a, RuntimeOptions rt, bool layout_given = false);

// --quantize and --group-size for `build` and every command that runs a model: the group size when
// --quantize int4 is given, nullopt when neither is; Error naming the flag for an unknown --quantize
// value or a --group-size without --quantize (the group size itself is checked against the model's
// weights by the build, quant/int4.h).
inline constexpr int64_t kDefaultInt4Group = 128;
std::optional<int64_t> int4_group_option(const std::string& quantize, int64_t group_size);

void add_quantize_options(CLI::App& app, std::string& quantize, int64_t& group_size, std::string& calibration,
                          std::string& calibration_ids, bool& quantize_lm_head);

std::vector<int32_t> parse_ids(const std::string& csv);
std::vector<int> parse_int_list(const std::string& csv);

// Subcommand registration (one file each).
void add_generate(CLI::App& app);
void add_check(CLI::App& app);
void add_bench(CLI::App& app);
void add_text_commands(CLI::App& app);  // tokenize, template
void add_chat(CLI::App& app);
void add_eval(CLI::App& app);  // eval-logits
void add_build(CLI::App& app);
void add_inspect(CLI::App& app);
void add_serve(CLI::App& app);
void add_export(CLI::App& app);  // export --format onnx

}  // namespace ingot::cli
