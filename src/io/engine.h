// Engine: a model's spec plus its weights in the runtime layout (fused QKV and gate/up, one dtype),
// what every runner executes. Two ways make one: the build from a checkpoint folder here, and
// loading an engine file (io/engine_file.h), which stores what a build made. The layout is the
// family's runtime weight table (models/weights.h).
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "models/spec.h"

namespace ingot {

struct BuildOptions {
  std::optional<DType> dtype;  // weight dtype; default: the checkpoint's own
  // Called with checkpoint bytes converted so far and in all (for a progress bar).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct Engine {
  ModelSpec spec;
  DType weight_dtype = DType::F32;
  // Runtime-layout weights by runtime name, exactly the entries of the family's weight table
  // (decoder_weights in models/layers.h lists the names and shapes).
  std::map<std::string, HostTensor> weights;
  nlohmann::json provenance;  // where it was built from (checkpoint files, options)

  const HostTensor* find(const std::string& name) const {
    auto it = weights.find(name);
    return it == weights.end() ? nullptr : &it->second;
  }
  const HostTensor& get(const std::string& name) const;
  size_t weight_bytes() const;
};

// Reads DIR (config.json, generation_config.json, safetensors) and transforms it into an Engine: every
// checkpoint tensor of the weight table is checked (presence, shape, floating dtype) before any
// conversion, then converted to the engine dtype and stacked into its runtime weight.
Engine build_engine(const std::string& checkpoint_dir, const BuildOptions& options = {});
// An engine of the given shape with seeded random weights (normal, std 0.02; norms 1): for benchmarks
// of real shapes without a checkpoint.
Engine random_engine(const ModelSpec& spec, DType dtype, uint64_t seed = 0);

}  // namespace ingot
