// What every subcommand shares: where the model comes from, which backend runs it, and how errors
// reach the user.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "runtime/engine.h"
#include "runtime/model.h"

namespace ingot::cli {

struct ModelArgs {
  std::string model_dir;  // --model
  std::string device = "auto";  // --device auto|cpu|cuda
  std::string dtype;      // --dtype (weights and, on the GPU, activations)
  int threads = 0;        // --threads (CPU)
  void add_to(CLI::App& app, bool require_model = true);
};

// A model ready to run: the engine, the backend and the runtime that binds them.
struct Loaded {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

std::unique_ptr<Backend> make_backend(const std::string& device, DType dtype, int threads);
// Resolves "auto" to cuda when a GPU is usable, else cpu.
std::string resolve_device(const std::string& device);
Loaded load_model(const ModelArgs& a, RuntimeOptions rt);

std::vector<int32_t> parse_ids(const std::string& csv);
std::vector<int> parse_int_list(const std::string& csv);

// Subcommand registration (one file each).
void add_generate(CLI::App& app);
void add_check(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace ingot::cli
