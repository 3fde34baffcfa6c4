// A model family: everything ingot knows about one architecture, in one file under src/models/. Its
// config.json defaults and fields, its runtime weight table (Hugging Face names, shapes, fusions) and
// the wiring of one decoder layer from the shared helpers in layers.h. Adding an architecture means
// one such file plus its line in registry.cpp, which holds the list of supported families.
#pragma once
#include <cstdint>
#include <string>

#include "models/config_fields.h"
#include "models/spec.h"
#include "models/weights.h"

namespace ingot {

struct ForwardContext;

struct Family {
  const char* model_type;
  // head_dim when config.json gives none: 0 = hidden_size / num_attention_heads.
  int64_t default_head_dim;
  // Reads the family's own fields of config.json into a spec whose shared fields and rope are read
  // (io/model_config.cpp): its biases, q/k norm and sliding-window layers.
  void (*configure)(const ConfigFields& config, ModelSpec& spec);
  WeightTable (*weights)(const ModelSpec& spec);
  // One decoder layer's forward over the call's tokens.
  void (*layer)(ForwardContext& c, const LayerWeights& w, int layer);
  // A wrapper config (a multimodal model's) keeps the decoder's settings in this sub-object; fields it
  // lacks come from the top level. Null: the settings are at the top level.
  const char* text_config = nullptr;
  // Whether the family's layers read spec.kinds and spec.attn_gate (a dense family's forward and weight
  // table ignore them, so metadata that sets them for one is refused).
  bool hybrid = false;
};

// The family of model_type, or an Error listing the supported ones (prefixed by `where`, when given).
const Family& find_family(const std::string& model_type, const std::string& where = "");

// The runtime weight table of a spec, by its family.
inline WeightTable weight_table(const ModelSpec& spec) { return find_family(spec.family).weights(spec); }

}  // namespace ingot
