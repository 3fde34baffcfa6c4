// `ingot export --format onnx`: writes a decoder (Llama, Qwen2, Qwen3; Qwen3.5 with its linear layers'
// conv and recurrent states as further inputs/outputs) as an ONNX graph of the same static-cache forward
// the runtime runs (docs/design.md, "The forward contract"), with the cache explicit
// as graph inputs and outputs, plus ingot_export.json, the contract a caller codes against
// (docs/onnx.md). The weights come from the project's own build step (build_engine: the family's weight
// table, fused q|k|v and gate|up) and the spec from load_model_spec; nothing here re-reads a checkpoint.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/spec.h"
#include "models/state_layout.h"

namespace ingot::onnx_export {

// Which runtime the graph is shaped for.
//  OnnxRuntime: opset 24, cache written by TensorScatter, attention by the Attention op (opset 23+) with
//               an explicit additive mask.
//  TensorRT:    opset 17 (what TensorRT 8.6+/10's parser reads), cache written by ScatterElements with
//               indices built in the graph, attention decomposed into MatMul/Softmax.
enum class Target { OnnxRuntime, TensorRT };
std::string target_name(Target t);
Target parse_target(const std::string& s);  // Error unless onnxruntime or tensorrt

struct ExportOptions {
  std::optional<DType> dtype;  // weight and cache dtype; default: the checkpoint's
  // Arithmetic dtype. F32: every activation f32, 16-bit weights widened by a Cast at use. F16 (needs
  // dtype F16): the residual stream, projections, attention's matmuls and the MLP in f16; RMSNorm, RoPE,
  // the softmax (decomposed form) and Qwen3.5's conv/delta rule in f32 between Casts. BF16 is refused.
  DType compute = DType::F32;
  CacheLayout layout = CacheLayout::HeadsFirst;
  int max_batch = 1;     // the largest batch the contract promises (the batch dim itself is dynamic)
  int64_t capacity = 0;  // cache slots per row (a fixed dim of the cache inputs); 0: default_capacity
  Target target = Target::OnnxRuntime;
  bool force = false;    // replace an existing export folder (never any other folder)
};

struct ExportResult {
  std::string out_dir;
  ModelSpec spec;
  DType dtype = DType::F32;
  int64_t capacity = 0;
  int64_t nodes = 0;
  uint64_t weight_bytes = 0;
  std::vector<std::string> ops;
};

// Refuses, from config.json and the flags alone (before anything is written), what this exporter does
// not support: a family it has not been taught, an odd rotary dim; bounds out of range; and an output
// that is not a fresh path or an earlier export (with force). Returns the spec.
ModelSpec check_export(const std::string& model_dir, const std::string& out_dir, const ExportOptions& options);

// check_export, then builds the engine, writes model.onnx, model.onnx.data, ingot_export.json and the
// tokenizer files into a temporary folder beside out_dir and renames it onto out_dir at the end: a
// failure leaves no partial export behind (and an earlier export intact).
ExportResult export_onnx(const std::string& model_dir, const std::string& out_dir, const ExportOptions& options);

}  // namespace ingot::onnx_export
