// `ingot export --format onnx`: the static-cache graph for ONNX Runtime and TensorRT users
// (src/export/onnx, docs/onnx.md). Lives in the ingot_export library so the protobuf dependency stays
// out of the engine library.
#include <cstdio>

#include "common.h"
#include "core/error.h"
#include "export/onnx/onnx_export.h"
#include "options.h"

namespace ingot::cli {

void add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Export a checkpoint as an ONNX graph with an explicit static KV cache");
  struct Args {
    std::string format, model_dir, output, dtype, compute = "fp32", layout = "heads_first", target = "onnxruntime";
    int max_batch = 1;
    int64_t capacity = 0;
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--format", a->format, "output format (onnx)")->required()->check(CLI::IsMember({"onnx"}));
  cmd->add_option("--model", a->model_dir, "Hugging Face checkpoint folder (Llama, Qwen2, Qwen3, Qwen3.5)")->required();
  cmd->add_option("-o,--output", a->output, "export folder to write (model.onnx, model.onnx.data, ingot_export.json)")
      ->required();
  cmd->add_flag("--force", a->force, "replace an earlier export in that folder (never any other folder)");
  cmd->add_option("--dtype", a->dtype, "weight dtype: fp32, fp16 or bf16 (default: the checkpoint's); the cache is fp16 for fp16, else fp32")
      ->check(dtype_names());
  cmd->add_option("--compute", a->compute,
                  "arithmetic dtype: fp32 (default; 16-bit weights widened at use) or fp16 (needs --dtype fp16: "
                  "matmuls and the residual stream in fp16, norms, RoPE and softmax in fp32)")
      ->check(dtype_names());
  cmd->add_option("--layout", a->layout, "KV cache layout: heads_first or flattened")
      ->check(CLI::IsMember({"heads_first", "flattened"}));
  cmd->add_option("--max-batch", a->max_batch, "largest batch the contract promises (the batch dim is dynamic)")
      ->check(at_least(1));
  cmd->add_option("--capacity", a->capacity,
                  "cache slots per row, a fixed dim of the cache inputs (default: min(4096, max_position_embeddings))")
      ->check(at_least(1));
  cmd->add_option("--target", a->target,
                  "onnxruntime: opset 24, TensorScatter + Attention; tensorrt: opset 17, ScatterElements + "
                  "decomposed attention")
      ->check(CLI::IsMember({"onnxruntime", "tensorrt"}));
  cmd->callback([a] {
    onnx_export::ExportOptions o;
    if (!a->dtype.empty()) o.dtype = parse_dtype(a->dtype);
    o.compute = parse_dtype(a->compute);
    o.layout = parse_layout(a->layout);
    o.max_batch = a->max_batch;
    o.capacity = a->capacity;
    o.target = onnx_export::parse_target(a->target);
    o.force = a->force;
    const onnx_export::ExportResult r = onnx_export::export_onnx(a->model_dir, a->output, o);
    std::printf("wrote %s: %s, %lld layers, %s weights (%.2f MB), %s compute, %s target (opset %d), layout %s, capacity %lld, "
                "%lld nodes\n",
                r.out_dir.c_str(), r.spec.family.c_str(), (long long)r.spec.layers,
                std::string(dtype_name(r.dtype)).c_str(), double(r.weight_bytes) / 1e6,
                std::string(dtype_name(o.compute)).c_str(),
                onnx_export::target_name(o.target).c_str(), o.target == onnx_export::Target::OnnxRuntime ? 24 : 17,
                a->layout.c_str(), (long long)r.capacity, (long long)r.nodes);
  });
}

}  // namespace ingot::cli
