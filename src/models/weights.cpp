#include "models/weights.h"

#include "core/error.h"

namespace ingot {

namespace {
Shape stacked_rows(const std::vector<WeightSource>& sources) {
  Shape shape = sources.front().shape;
  shape[0] = 0;
  for (const WeightSource& s : sources) shape[0] += s.rows();
  return shape;
}
}  // namespace

void WeightTable::add_model(const DevWeight* ModelWeights::*field, std::string name, WeightSource source,
                            WeightInit init, WeightStorage storage) {
  WeightSpec w;
  w.name = std::move(name);
  w.sources = {std::move(source)};
  w.shape = storage.shape ? *storage.shape : stacked_rows(w.sources);
  w.init = init;
  w.storage = std::move(storage);
  w.model_field = field;
  entries_.push_back(std::move(w));
}

void WeightTable::add_layer(int layer, const DevWeight* LayerWeights::*field, const std::string& name,
                            std::vector<WeightSource> sources, WeightInit init, WeightStorage storage) {
  WeightSpec w;
  w.name = "layers." + std::to_string(layer) + "." + name;
  w.shape = storage.shape ? *storage.shape : stacked_rows(sources);
  w.sources = std::move(sources);
  w.init = init;
  w.storage = std::move(storage);
  w.layer = layer;
  w.layer_field = field;
  entries_.push_back(std::move(w));
}

void WeightTable::ignore(std::string prefix, std::string note) { ignored_.emplace_back(std::move(prefix), std::move(note)); }

ModelWeights bind_weights(const ModelSpec& spec, const WeightTable& table, const std::map<std::string, DevWeight>& placed) {
  ModelWeights mw;
  mw.layers.resize(size_t(spec.layers));
  for (const WeightSpec& w : table.entries()) {
    auto it = placed.find(w.name);
    if (it == placed.end()) throw Error("engine is missing weight '" + w.name + "'");
    if (w.layer >= 0) mw.layers[size_t(w.layer)].*w.layer_field = &it->second;
    else mw.*w.model_field = &it->second;
  }
  if (spec.tie_embeddings) mw.lm_head = mw.embed;
  return mw;
}

}  // namespace ingot
