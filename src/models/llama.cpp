// Llama 3.x (model_type "llama"): pre-norm decoder, GQA, SwiGLU MLP, optional biases on q/k/v/o
// (attention_bias), lm_head untied unless tie_word_embeddings. Its tensor names are the base table.
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

static WeightTable llama_weights(const ModelSpec& s) { return llama_style_weights(s); }

extern const Family kLlamaFamily{"llama", llama_weights, prenorm_decoder_layer};

}  // namespace ingot
