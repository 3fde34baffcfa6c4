// Weight-only INT4: the one packed layout every INT4 weight has at run time, whatever made it (today
// round-to-nearest at build; later the published GPTQ / AWQ / compressed-tensors formats, converted
// into it). A weight [out, in] of the runtime table becomes two tensors:
//   <name>         [out, in/2] uint8: value k of a row in byte k/2, low nibble first (even k low)
//   <name>.scales  [out, in/group] in the engine's weight dtype (f32, f16 or bf16)
// and value = (nibble - 8) * scale of its group: symmetric, no zero point, nibble 0 (-8) unused by
// round-to-nearest (its range is [-7, 7] so that the largest magnitude of a group is exact).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/int4_row.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "models/spec.h"
#include "models/weights.h"

namespace ingot {

inline constexpr const char* kInt4ScalesSuffix = ".scales";
inline constexpr int64_t kInt4MinGroup = 32, kInt4MaxGroup = 256;

// How an engine's weights are quantized (absent: none). Engine files record it as
// weights.quantization (docs/quantization.md).
struct QuantConfig {
  std::string method = "rtn";  // how the values were chosen: "rtn", round to nearest
  int bits = 4;
  int64_t group_size = 128;    // columns (input features) sharing one scale
  std::vector<std::string> tensors;  // runtime names of the INT4 weights, in table order
};

// The runtime weights a quantized build stores as INT4: the decoder layers' linear projections (fused
// q/k/v, o, fused gate/up, down). Embeddings, norms, the LM head and the linear-attention weights stay
// in the engine dtype.
bool int4_quantizable(const WeightSpec& w);
// The table's quantizable weights, checked against the group size first: Error naming `flag` and the
// first tensor whose input dimension it does not divide, or the group size when it is not a power of
// two in [32, 256].
QuantConfig plan_int4(const WeightTable& table, int64_t group_size, const std::string& flag);

// [out, in/2] and [out, in/group] for a weight of runtime shape [out, in].
Shape int4_packed_shape(const Shape& shape);
Shape int4_scales_shape(const Shape& shape, int64_t group_size);

// Round to nearest, per group: scale = max|w| / 7 rounded to scale_dtype, nibble = clamp(round(w /
// scale), -7, 7) + 8 (a group of zeros gets scale 0). w [rows, cols] f32; packed [rows, cols/2];
// scales [rows, cols/group] in scale_dtype.
void quantize_int4(const float* w, int64_t rows, int64_t cols, int64_t group_size, DType scale_dtype, uint8_t* packed,
                   void* scales);
// weights.quantization of an engine file: "none", or the object docs/quantization.md describes.
nlohmann::json quant_json(const QuantConfig* q, DType scale_dtype);

}  // namespace ingot
