// Qwen2 / Qwen2.5 (model_type "qwen2"): the Llama layout with biases on q/k/v always and none on o
// (whatever attention_bias says), and Qwen's sliding-window layers.
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

namespace {
void configure(const ConfigFields& f, ModelSpec& s) {
  s.qkv_bias = true;
  s.o_bias = false;
  qwen_sliding_windows(f, s);
}
}  // namespace

extern const Family kQwen2Family{"qwen2", 0, configure, decoder_weights, prenorm_decoder_layer};

}  // namespace ingot
