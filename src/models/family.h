// A model family: its config.json defaults and fields, the table from Hugging Face tensor names to ours
// with the shape each must have, and the wiring of one decoder layer from the shared helpers in
// layers.h. Adding an architecture means one file here plus its line in registry.cpp, which holds the
// list of supported families.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/config_fields.h"
#include "models/spec.h"

namespace ingot {

struct ForwardContext;
struct LayerWeights;

struct WeightDecl {
  std::string hf_name;  // name in the checkpoint
  std::string name;     // our name before the layout transform (e.g. layers.0.wq)
  Shape shape;          // required shape, checked at load
};

class WeightTable {
 public:
  void add(std::string hf_name, std::string name, Shape shape) {
    decls_.push_back({std::move(hf_name), std::move(name), std::move(shape)});
  }
  const std::vector<WeightDecl>& decls() const { return decls_; }

 private:
  std::vector<WeightDecl> decls_;
};

struct Family {
  const char* model_type;
  // head_dim when config.json gives none: 0 = hidden_size / num_attention_heads.
  int64_t default_head_dim;
  // Reads the family's own fields of config.json into a spec whose shared fields and rope are read
  // (io/model_config.cpp): its biases, q/k norm and sliding-window layers.
  void (*configure)(const ConfigFields& config, ModelSpec& spec);
  WeightTable (*weights)(const ModelSpec&);
  void (*layer)(ForwardContext&, const LayerWeights&, int layer);
};

// The family of model_type, or an Error listing the supported ones (prefixed by `where`, when given).
const Family& find_family(const std::string& model_type, const std::string& where = "");

}  // namespace ingot
