// Engine: a model's spec plus its weights in the runtime layout (fused QKV and gate/up, one dtype),
// the output of the build step that every runner executes and that engine files store.
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/model_config.h"

#pragma once

namespace ingot {

struct BuildOptions {
  std::optional<DType> dtype;  // weight dtype; default: the checkpoint's own
  // Called with checkpoint bytes converted so far and in all (for a progress bar).
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Called with one line for each harmless oddity of the checkpoint (tensors it carries that the model
  // does not use but that cannot change its output); unset: printed to stderr as "warning: ...".
  std::function<void(const std::string& line)> warn;
};

struct Engine {
  ModelSpec spec;
  DType weight_dtype = DType::F32;
  // Runtime-layout weights, by our names:
  //   tok_embeddings [vocab, hidden]; final_norm [hidden]; lm_head [vocab, hidden] (absent when tied)
  //   layers.{i}.attn_norm [hidden]; .wqkv [(q_heads + 2*kv_heads)*head_dim, hidden]; .bqkv [same rows]
  //   .q_norm/.k_norm [head_dim]; .wo [hidden, q_heads*head_dim]; .bo [hidden]; .mlp_norm [hidden]
  //   .w_gate_up [2*intermediate, hidden] (gate rows, then up rows); .w_down [hidden, intermediate]
  std::map<std::string, HostTensor> weights;
  nlohmann::json provenance;  // where it was built from (checkpoint files, options)

  const HostTensor* find(const std::string& name) const {
    auto it = weights.find(name);
    return it == weights.end() ? nullptr : &it->second;
  }
  const HostTensor& get(const std::string& name) const;
  size_t weight_bytes() const;
};

// Reads DIR (config.json, generation_config.json, safetensors) and transforms it into an Engine.
// Refuses, naming the tensors, a checkpoint that does not match its config: a tensor missing or of
// another shape, or tensors the config's model would not use (e.g. layers beyond num_hidden_layers);
// and any NaN or infinite weight (also one that overflows the engine dtype), found while converting.
Engine build_engine(const std::string& checkpoint_dir, const BuildOptions& options = {});
// An engine of the given shape with seeded random weights (normal, std 0.02; norms 1): for benchmarks
// of real shapes without a checkpoint.
Engine random_engine(const ModelSpec& spec, DType dtype, uint64_t seed = 0);

}  // namespace ingot
