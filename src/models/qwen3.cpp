// Qwen3 (model_type "qwen3"): the Llama layout plus a per-head RMSNorm on q and k before RoPE
// (self_attn.q_norm / k_norm, applied inside the fused RoPE + cache-write op), biases per
// attention_bias (none by default), head_dim 128 unless given (Qwen3Config's default, not
// hidden/heads), and Qwen's sliding-window layers.
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

namespace {
void configure(const ConfigFields& f, ModelSpec& s) {
  s.qk_norm = true;
  qwen_sliding_windows(f, s);
}
}  // namespace

extern const Family kQwen3Family{"qwen3", 128, configure, decoder_weights, prenorm_decoder_layer};

}  // namespace ingot
