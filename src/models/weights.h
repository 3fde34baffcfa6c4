// The runtime weight table: every weight of a model in the runtime layout, with the checkpoint tensors
// it is made of and the place the forward reads it from. A family writes it once (models/family.h);
// the engine build checks, converts and fuses by it, random engines fill by it, engine files are
// validated against it, and Model binds the weights on the backend by it.
#pragma once
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "models/spec.h"

namespace ingot {

// One weight in backend memory, in the engine's runtime layout.
struct DevWeight {
  Mat m;  // rows x cols (vectors are 1 x n)
  const void* data() const { return m.data; }
};

// A layer's weights as the forward helpers (models/layers.h) read them; optional ones are null.
struct LayerWeights {
  const DevWeight* attn_norm = nullptr;  // [hidden]
  const DevWeight* wqkv = nullptr;       // [(q_heads + 2*kv_heads) * head_dim, hidden]: q rows, k rows, v rows
  const DevWeight* bqkv = nullptr;       // [(q_heads + 2*kv_heads) * head_dim] or null
  const DevWeight* q_norm = nullptr;     // [head_dim] or null
  const DevWeight* k_norm = nullptr;     // [head_dim] or null
  const DevWeight* wo = nullptr;         // [hidden, q_heads * head_dim]
  const DevWeight* bo = nullptr;         // [hidden] or null
  const DevWeight* mlp_norm = nullptr;   // [hidden]
  const DevWeight* w_gate_up = nullptr;  // [2 * intermediate, hidden]: gate rows then up rows
  const DevWeight* w_down = nullptr;     // [hidden, intermediate]
  // Linear-attention (Gated DeltaNet) layers, in place of the attention weights above.
  const DevWeight* lin_in = nullptr;     // [conv_channels + value_width + 2*v_heads, hidden]: qkv | z | b | a
  const DevWeight* lin_conv = nullptr;   // [conv_channels, conv_kernel]
  const DevWeight* lin_a_log = nullptr;  // [v_heads] f32
  const DevWeight* lin_dt_bias = nullptr;  // [v_heads] f32
  const DevWeight* lin_norm = nullptr;   // [v_dim] (the gated output norm, used as is)
  const DevWeight* lin_out = nullptr;    // [hidden, value_width]
};

// The whole model's weights on the backend.
struct ModelWeights {
  const DevWeight* embed = nullptr;       // [vocab, hidden]
  const DevWeight* final_norm = nullptr;  // [hidden]
  const DevWeight* lm_head = nullptr;     // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers;       // [layers]
};

// A checkpoint tensor by its Hugging Face name, with the shape it must have. By default all its rows
// are taken; a pick takes, of every `stride` rows, the `block` rows from `offset` on (e.g. the query
// rows of a q_proj that interleaves [query | gate] per head).
struct RowPick {
  int64_t block = 0, stride = 0, offset = 0;  // block 0: every row
};
struct WeightSource {
  std::string hf_name;
  Shape shape;
  RowPick pick{};
  int64_t rows() const { return pick.block ? shape[0] / pick.stride * pick.block : shape[0]; }
};

// How random_engine fills a weight: normal (std 0.02), or ones for the RMSNorm weights.
enum class WeightInit { Normal, Ones };

// How a weight is stored, when not as the others: its own dtype (f32 for the few small weights the
// forward reads in f32 whatever the engine's dtype), a constant added to every value in f32 at build
// (Qwen3.5's norms compute x * (1 + w): the 1 is folded into an f32 weight, never into a 16-bit one),
// and a runtime shape other than the stacked rows (a conv weight [C, 1, K] read as [C, K]).
struct WeightStorage {
  std::optional<DType> dtype;
  float add = 0.0f;
  std::optional<Shape> shape;
};

struct WeightSpec {
  std::string name;                   // runtime name: tok_embeddings, layers.{i}.wqkv, ...
  Shape shape;                        // runtime shape: the sources stacked along rows (or storage.shape)
  std::vector<WeightSource> sources;  // concatenated along rows in this order (one: a plain copy)
  WeightInit init = WeightInit::Normal;  // of the stored value (after storage.add)
  WeightStorage storage;
  // The dtype this weight is stored in by an engine of weights in `engine_dtype`.
  DType dtype(DType engine_dtype) const { return storage.dtype.value_or(engine_dtype); }
  // Where Model binds it: a field of layer `layer`'s LayerWeights, or (layer -1) of ModelWeights.
  int layer = -1;
  const DevWeight* LayerWeights::*layer_field = nullptr;
  const DevWeight* ModelWeights::*model_field = nullptr;
};

// A model's weights in the order a build checks them; optional ones (biases, q/k norms, an untied
// lm_head) are present exactly when the spec has them.
class WeightTable {
 public:
  void add_model(const DevWeight* ModelWeights::*field, std::string name, WeightSource source,
                 WeightInit init = WeightInit::Normal, WeightStorage storage = {});
  // layers.{layer}.{name}, the sources stacked along rows.
  void add_layer(int layer, const DevWeight* LayerWeights::*field, const std::string& name,
                 std::vector<WeightSource> sources, WeightInit init = WeightInit::Normal, WeightStorage storage = {});
  // Checkpoint tensors under `prefix` that the model does not read (a vision tower, a multi-token
  // prediction head): a build skips them with `note` instead of refusing them as unused.
  void ignore(std::string prefix, std::string note);
  const std::vector<WeightSpec>& entries() const { return entries_; }
  const std::vector<std::pair<std::string, std::string>>& ignored() const { return ignored_; }

 private:
  std::vector<WeightSpec> entries_;
  std::vector<std::pair<std::string, std::string>> ignored_;  // prefix, note
};

// The table's weights looked up (by runtime name) among those placed on the backend; Error naming the
// first one missing. When the spec ties the embeddings, the LM head is the embedding.
ModelWeights bind_weights(const ModelSpec& spec, const WeightTable& table,
                          const std::map<std::string, DevWeight>& placed);

}  // namespace ingot
