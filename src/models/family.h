// A model family: the table from Hugging Face tensor names to ours, with the shape each must have, and
// the wiring of one decoder layer from the shared helpers in layers.h. Adding an architecture means one
// file here plus its line in registry.cpp.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"

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
  WeightTable (*weights)(const ModelSpec&);
  void (*layer)(ForwardContext&, const LayerWeights&, int layer);
};

// The family for config.json's model_type, or an Error listing the supported ones.
const Family& find_family(const std::string& model_type);

}  // namespace ingot
