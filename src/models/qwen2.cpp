// Qwen2 / Qwen2.5 (model_type "qwen2"): the Llama layout with biases on q/k/v and none on o (the spec
// sets qkv_bias for this family, so the base table declares them), and sliding-window layers from
// max_window_layers on when use_sliding_window is set (ModelSpec::window).
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

static WeightTable qwen2_weights(const ModelSpec& s) { return llama_style_weights(s); }

extern const Family kQwen2Family{"qwen2", qwen2_weights, prenorm_decoder_layer};

}  // namespace ingot
