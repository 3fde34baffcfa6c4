// RoPE tables of a spec, computed in f32 the way transformers computes them, so that the rotary
// angles (and with them every logit) match the reference bit for bit on the CPU.
#pragma once
#include <vector>

#include "models/spec.h"

namespace ingot {

// Inverse frequencies [rope_dim / 2], scaled by the spec's rope type (linear, llama3, yarn).
std::vector<float> rope_inv_freq(const ModelSpec& spec);
// The factor on cos and sin (YaRN's attention factor; 1 for the other types).
float rope_attention_scale(const ModelSpec& spec);

}  // namespace ingot
