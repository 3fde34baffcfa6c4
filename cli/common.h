// What every subcommand shares: where the model comes from, which backend runs it, and how errors
// reach the user.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/engine_file.h"
#include "io/engine.h"
#include "runtime/model.h"

namespace ingot::cli {

struct ModelArgs {
  std::string model_dir;  // --model
  std::string engine_path;  // --engine (an engine file from `ingot build`), the alternative to --model
  std::string device = "auto";  // --device auto|cpu|cuda
  std::string dtype;      // --dtype (weights and, on the GPU, activations)
  int threads = 0;        // --threads (CPU)
  bool no_verify = false;  // --no-verify: skip the engine file's blob checksums
  bool quiet = false;      // --quiet: no progress bar
  // Commands that run a model need exactly one of --model / --engine (checked by open_engine).
  void add_to(CLI::App& app);
  const std::string& source_name() const { return engine_path.empty() ? model_dir : engine_path; }
};

// The engine a command runs: built from --model, or loaded from --engine (then `file` says what the
// file stores: bounds, tokenizer, provenance).
struct EngineSource {
  std::unique_ptr<Engine> engine;
  std::optional<EngineFileInfo> file;
};

// A model ready to run: the engine, the backend and the runtime that binds them.
struct Loaded {
  std::unique_ptr<Engine> engine;
  std::optional<EngineFileInfo> engine_file;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

std::unique_ptr<Backend> make_backend(const std::string& device, DType dtype, int threads);
// Resolves "auto" to cuda when a GPU is usable, else cpu.
std::string resolve_device(const std::string& device);
EngineSource open_engine(const ModelArgs& a);
// With an engine file: the request's capacity and batch, at most the stored bounds (see the library's
// fit_engine_bounds); with a checkpoint: rt unchanged.
RuntimeOptions fit_engine_bounds(const EngineSource& src, RuntimeOptions rt, bool layout_given);
// Before the engine is built or its checksums read: refuses a request beyond an engine file's bounds,
// or one whose memory the host cannot hold (the weights a checkpoint build converts, and, with a
// host-memory backend, the Model's cache and workspace). The device is checked by the Model itself.
void check_before_loading(const ModelArgs& a, const RuntimeOptions& rt, bool layout_given, const Backend* host_backend);
// Refuses a GPU the engine file was not built for (before any GPU work).
void check_device(const EngineSource& src, const std::string& device);
Loaded load_model(const ModelArgs& a, RuntimeOptions rt, bool layout_given = false);

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

}  // namespace ingot::cli
