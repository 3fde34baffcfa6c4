// Llama 3.x (model_type "llama"): pre-norm decoder, GQA, SwiGLU MLP, optional biases on q/k/v/o
// (attention_bias, read with the shared fields), lm_head untied unless tie_word_embeddings, no
// sliding windows. Its tensor names are the base table.
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

namespace {
void configure(const ConfigFields&, ModelSpec&) {}  // nothing beyond the shared fields
}  // namespace

extern const Family kLlamaFamily{"llama", 0, configure, decoder_weights, prenorm_decoder_layer};

}  // namespace ingot
