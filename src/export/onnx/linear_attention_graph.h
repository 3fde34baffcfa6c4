// The ONNX wiring of a Qwen3.5 linear-attention (Gated DeltaNet) layer's token mixer, mirroring the CPU
// reference ops (src/backend/cpu/linear_attention.cpp): causal conv1d + SiLU over a conv state, the
// gated delta rule over a recurrent state (a Scan over the chunk's tokens, one token per step, as the
// runtime runs it), the gated RMSNorm. Both states are f32 graph inputs/outputs whatever the weight
// dtype, as the runtime keeps them.
#pragma once
#include <cstdint>
#include <string>

#include "export/onnx/graph_builder.h"
#include "models/spec.h"

namespace ingot::onnx_export {

// Value names of one layer's weights, each already f32 (16-bit ones widened by the caller's Cast).
struct LinearAttnWeights {
  std::string conv;     // [C, K] depthwise conv taps
  std::string a_log;    // [v_heads]
  std::string dt_bias;  // [v_heads]
  std::string norm;     // [v_dim] gated RMSNorm weight (used as is: no 1 + w)
};

// Graph values shared by every layer.
struct LinearAttnContext {
  std::string ids_shape;      // [2] = (B, S)
  std::string write_indices;  // [B] int64
  std::string eps;            // f32 scalar: rms_eps
  std::string past_conv, present_conv;            // [B, C, K-1] graph input / output names
  std::string past_recurrent, present_recurrent;  // [B, v_heads, d_k, d_v]
};

// proj [N, C + V + 2 * v_heads] (in_proj's qkv | z | b | a, N = B*S token-major) -> [N, V], the layer's
// output before out_proj. Writes the present states as the named graph outputs.
std::string linear_attention(GraphBuilder& g, const ModelSpec& s, const LinearAttnWeights& w,
                             const LinearAttnContext& c, const std::string& proj, int64_t layer);

}  // namespace ingot::onnx_export
