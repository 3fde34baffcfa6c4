// Qwen3 (model_type "qwen3"): the Llama layout plus a per-head RMSNorm on q and k before RoPE
// (self_attn.q_norm / k_norm, applied inside the fused RoPE + cache-write op), no biases by default,
// explicit head_dim, optional sliding-window layers.
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

static WeightTable qwen3_weights(const ModelSpec& s) { return llama_style_weights(s, declare_qk_norm); }

extern const Family kQwen3Family{"qwen3", qwen3_weights, prenorm_decoder_layer};

}  // namespace ingot
