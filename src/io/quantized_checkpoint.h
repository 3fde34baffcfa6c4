// Published INT4 checkpoints (GPTQ, AWQ "gemm", compressed-tensors "pack-quantized"): config.json's
// quantization_config read and checked, and each quantized linear module's tensors converted, exactly,
// into the runtime INT4 layout of quant/int4.h. The layouts and their sources are in
// docs/quantization.md ("Published formats").
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "quant/int4.h"

namespace ingot {

// quantization_config, as far as the conversion needs it.
struct PublishedQuant {
  std::string method;      // "gptq", "awq", "compressed-tensors"
  std::string format;      // "gptq" (stored zeros offset by one), "gptq_v2", "gemm", "pack-quantized"
  int64_t group_size = 0;  // -1: one group per row (GPTQ group_size -1, compressed-tensors channel strategy)
  bool symmetric = true;   // false: zero points are kept (AWQ always has them)
  bool act_order = false;  // GPTQ desc_act: g_idx may reorder the input columns
};

// DIR/config.json's quantization_config, every field this version reads checked (Error naming
// "config.json: quantization_config.<field>" and what it holds), or nullopt when there is none.
std::optional<PublishedQuant> read_published_quant(const std::string& dir);

// The checkpoint tensor names of a quantized linear module `prefix` (a source name without ".weight")
// in this format; the first is the packed weight, whose presence marks the module as quantized.
std::vector<std::string> published_tensor_names(const PublishedQuant& q, const std::string& prefix);

// Whether the checkpoint holds `w`'s sources quantized (true), as plain weights (false); Error naming
// the tensors when only some are, or when `w` is a weight ingot keeps 16-bit (an embedding, the LM
// head, a linear-attention projection) but the checkpoint quantized it.
bool published_quantized(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w);

// One runtime INT4 weight, in the layout of quant/int4.h.
struct Int4Parts {
  HostTensor packed;                // [out, in/2] u8
  HostTensor scales;                // [out, in/G] scale dtype
  std::optional<HostTensor> zeros;  // [out, in/G] u8 (asymmetric only)
  std::optional<HostTensor> perm;   // [in] i32 (act-order only)
};

// Checks every tensor of `w`'s quantized sources (present, dtype, shape, group size dividing, g_idx a
// grouping the runtime layout can hold and equal across fused sources) before any conversion; Errors
// name the folder, the tensor and what was expected.
void check_published(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w);

// Converts `w`'s quantized sources (stacked along rows as the table fuses them) into the runtime
// layout: the same values, nibble for nibble, zero for zero; the scales converted to `scale_dtype`
// (exact from fp16 to f16 or f32; `rounded` is set when a scale changed, e.g. fp16 to bf16), in groups
// of `group` columns (int4_runtime_group; it divides the published group, whose scale and zero repeat
// over the runtime groups it spans).
Int4Parts convert_published(const PublishedQuant& q, const Checkpoint& ck, const WeightSpec& w, DType scale_dtype,
                            int64_t group, bool* rounded = nullptr);

}  // namespace ingot
