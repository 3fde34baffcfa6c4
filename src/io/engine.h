// Engine: a model's spec plus its weights in the runtime layout (fused QKV and gate/up, one dtype),
// what every runner executes. Two ways make one: the build from a checkpoint folder here, and
// loading an engine file (io/engine_file.h), which stores what a build made. The layout is the
// family's runtime weight table (models/weights.h).
#pragma once
#include <functional>
#include <map>
#include <vector>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "models/spec.h"
#include "quant/int4.h"

namespace ingot {

struct Engine;
struct WeightSpec;

// Where a build puts each weight it made, whole, in the runtime layout and in table order. Unset, the
// weight is stored in the engine under its name. A tensor-parallel rank's build (runtime/tp_split.h,
// build_rank_engine) stores only its slice and lets the whole tensor go, so that a process never holds
// more of the model than its slice and the one tensor being made.
using WeightSink = std::function<void(Engine& engine, const WeightSpec& w, HostTensor&& whole)>;

struct BuildOptions {
  std::optional<DType> dtype;  // weight dtype; default: the checkpoint's own
  // Set: the linear weights are stored as INT4 of this group size, round to nearest (quant/int4.h).
  std::optional<int64_t> int4_group_size;
  // (Activation-aware INT4 runs the model, so it is not part of this build: callers build without
  // int4_group_size and apply runtime/awq.h's quantize_engine_awq to the result.)
  // With int4_group_size: the (untied) LM head as INT4 too, round to nearest.
  bool quantize_lm_head = false;
  // Called with checkpoint bytes converted so far and in all (for a progress bar).
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Called with one line for each harmless oddity of the checkpoint (tensors it carries that the model
  // does not use but that cannot change its output); unset: printed to stderr as "warning: ...".
  std::function<void(const std::string& line)> warn;
  // Set: every weight goes through it (above). INT4 weights (published or --quantize) are refused then:
  // a sink sees plain weights only.
  WeightSink sink;
};

struct Engine {
  ModelSpec spec;
  DType weight_dtype = DType::F32;
  // Runtime-layout weights by runtime name, exactly the entries of the family's weight table
  // (decoder_weights in models/layers.h lists the names and shapes).
  // A quantized engine holds each weight of quant->tensors as its packed INT4 tensor [out, in/2] u8
  // under the table's name, plus "<name>.scales" [out, in/group] in weight_dtype.
  std::map<std::string, HostTensor> weights;
  std::optional<QuantConfig> quant;  // absent: every weight as the table says
  nlohmann::json provenance;  // where it was built from (checkpoint files, options)

  const HostTensor* find(const std::string& name) const {
    auto it = weights.find(name);
    return it == weights.end() ? nullptr : &it->second;
  }
  const HostTensor& get(const std::string& name) const;
  size_t weight_bytes() const;
};

// Reads DIR (config.json, generation_config.json, safetensors) and transforms it into an Engine by the
// family's weight table. Refuses, naming the tensors, a checkpoint that does not match its config: a
// tensor missing or of another shape or dtype (all checked before any conversion), or tensors the
// config's model would not use (e.g. layers beyond num_hidden_layers); and any NaN or infinite weight
// (also one that overflows the engine dtype), found while converting and stacking into the runtime
// weights.
Engine build_engine(const std::string& checkpoint_dir, const BuildOptions& options = {});
// The weight dtype build_engine gives the checkpoint folder `dir` (spec read from it): `requested`,
// else config.json's torch_dtype, else the dtype of the checkpoint's first weight.
DType build_dtype(const std::string& dir, const ModelSpec& spec, std::optional<DType> requested);
// Replaces the quantizable weights of `engine` (quant/int4.h) by INT4, round to nearest per group of
// `group_size` input columns, scales in the engine's weight dtype. `flag` names the option in errors
// (a group size that is not allowed or does not divide a weight's input dimension, checked before any
// weight changes).
// lm_head: the untied LM head too (--quantize-lm-head; plan_int4 refuses a tied one).
// clip: per weight name, [out, in/group] clip ratios for quantize_int4 (the activation-aware build's);
// weights not named take plain RTN.
void quantize_engine_int4(Engine& engine, int64_t group_size, const std::string& flag = "--group-size",
                          bool lm_head = false, const std::map<std::string, std::vector<float>>* clip = nullptr);
// The runtime name -> (shape, dtype) of every tensor an engine of `spec` with weights in `dtype` and
// quantization `quant` (or none) holds: the family's table, with INT4 weights packed and their scales.
std::map<std::string, std::pair<Shape, DType>> engine_tensor_shapes(const ModelSpec& spec, DType dtype,
                                                                    const QuantConfig* quant);
// An engine of the given shape with seeded random weights (normal, std 0.02; norms 1): for benchmarks
// of real shapes without a checkpoint. Each weight's values depend only on (seed, its name), not on
// the weights made before it, so one rank's build can make each weight alone; `sink` as in BuildOptions.
Engine random_engine(const ModelSpec& spec, DType dtype, uint64_t seed = 0, const WeightSink& sink = {});

}  // namespace ingot
