// Qwen3.5 (model_type "qwen3_5_text", and "qwen3_5": the published multimodal wrapper, whose text
// settings sit under text_config and weights under model.language_model.*; its vision tower is
// skipped). A hybrid decoder: most layers mix tokens by linear attention (Gated DeltaNet, with a conv
// state and a recurrent state per cache row), every few layers by gated softmax attention over the KV
// cache; each layer then has the Llama MLP. The facts below were checked against transformers'
// modeling_qwen3_5.py (docs/qwen3_5.md):
//   - every RMSNorm but the linear layers' output norm computes x * (1 + w) in f32 with w stored around
//     0: the 1 is folded into an f32 copy of the weight at build (exact, as transformers adds it in
//     f32), never into a 16-bit one;
//   - attention: q_proj gives [query | gate] per head (wqkv stacks the query rows, k, v, then the gate
//     rows), per-head q/k norms, RoPE on the first partial_rotary_factor * head_dim dims (text-only
//     mRoPE is 1-D), output * sigmoid(gate) before o_proj;
//   - linear layers: in_proj_qkv | in_proj_z | in_proj_b | in_proj_a fused into one projection, conv1d
//     [C, 1, K] read as [C, K], A_log and dt_bias kept in f32, norm used as is (w * norm(x) * silu(z)).
#include "models/family.h"
#include "models/layers.h"

namespace ingot {

namespace {

void configure(const ConfigFields& f, ModelSpec& s) {
  s.qk_norm = true;
  s.attn_gate = f.bool_or("attn_output_gate", true);
  // transformers' default rotary fraction for this family when config.json names none.
  const bool rotary_given = f.has("partial_rotary_factor") ||
                            (f.has("rope_parameters") && f.j["rope_parameters"].is_object() &&
                             f.j["rope_parameters"].contains("partial_rotary_factor"));
  if (!rotary_given) s.rope.partial_rotary_factor = 0.25;
  if (s.rope_dim() < 2 || s.rope_dim() % 2 != 0)
    throw Error(f.src + ": partial_rotary_factor " + std::to_string(s.rope.partial_rotary_factor) + " x head_dim " +
                std::to_string(s.head_dim) + " gives " + std::to_string(s.rope_dim()) +
                " rotary dims; it must be even and at least 2");

  // Layer kinds: layer_types when given, else every full_attention_interval-th layer is full attention.
  s.kinds.assign(size_t(s.layers), LayerKind::Linear);
  if (f.has("layer_types")) {
    const nlohmann::json& lt = f.j["layer_types"];
    if (!lt.is_array() || int64_t(lt.size()) != s.layers)
      throw Error(f.where("layer_types") + " must list one entry per layer (" + std::to_string(s.layers) + "), got " +
                  (lt.is_array() ? std::to_string(lt.size()) + " entries" : std::string("a ") + lt.type_name()));
    for (int64_t i = 0; i < s.layers; ++i) {
      const std::string t = lt[size_t(i)].is_string() ? lt[size_t(i)].get<std::string>() : lt[size_t(i)].dump();
      if (t == "full_attention") s.kinds[size_t(i)] = LayerKind::Attention;
      else if (t != "linear_attention")
        throw Error(f.where("layer_types") + ": entry " + std::to_string(i) + " is '" + t +
                    "' (expected linear_attention or full_attention)");
    }
  } else {
    const int64_t every = f.positive_int_or("full_attention_interval", 4);
    for (int64_t i = 0; i < s.layers; ++i)
      if ((i + 1) % every == 0) s.kinds[size_t(i)] = LayerKind::Attention;
  }
  LinearAttnSpec& l = s.linear;
  l.k_heads = f.positive_int("linear_num_key_heads", kMaxLinearHeads);
  l.v_heads = f.positive_int("linear_num_value_heads", kMaxLinearHeads);
  l.k_dim = f.positive_int("linear_key_head_dim", kMaxLinearKeyDim);
  l.v_dim = f.positive_int("linear_value_head_dim", kMaxLinearValueDim);
  l.conv_kernel = f.positive_int("linear_conv_kernel_dim", kMaxConvKernel);
  check_linear_spec(s, f.src);
}

// Where the decoder's tensors live: model.* for the text-only class, model.language_model.* for the
// multimodal wrapper.
std::string prefix(const ModelSpec& s) { return s.family == "qwen3_5" ? "model.language_model." : "model."; }

// x * (1 + w) norms: stored in f32 with the 1 folded in.
const WeightStorage kUnitOffsetNorm{DType::F32, 1.0f, std::nullopt};

WeightTable weights(const ModelSpec& s) {
  WeightTable t;
  const WeightInit ones = WeightInit::Ones;
  const std::string p = prefix(s);
  const LinearAttnSpec& l = s.linear;
  t.add_model(&ModelWeights::embed, "tok_embeddings", {p + "embed_tokens.weight", {s.vocab, s.hidden}});
  t.add_model(&ModelWeights::final_norm, "final_norm", {p + "norm.weight", {s.hidden}}, ones, kUnitOffsetNorm);
  if (!s.tie_embeddings) t.add_model(&ModelWeights::lm_head, "lm_head", {"lm_head.weight", {s.lm_head_rows(), s.hidden}});
  for (int i = 0; i < s.layers; ++i) {
    const std::string hf = p + "layers." + std::to_string(i) + ".", mlp = hf + "mlp.";
    t.add_layer(i, &LayerWeights::attn_norm, "attn_norm", {{hf + "input_layernorm.weight", {s.hidden}}}, ones,
                kUnitOffsetNorm);
    if (s.kind(i) == LayerKind::Attention) {
      const std::string at = hf + "self_attn.";
      const int64_t q_rows = s.q_dim() * (s.attn_gate ? 2 : 1), D = s.head_dim;
      // [query | gate] per head: of every 2 * head_dim rows, the first head_dim are the query.
      const RowPick query = s.attn_gate ? RowPick{D, 2 * D, 0} : RowPick{}, gate{D, 2 * D, D};
      std::vector<WeightSource> qkv = {{at + "q_proj.weight", {q_rows, s.hidden}, query},
                                       {at + "k_proj.weight", {s.kv_dim(), s.hidden}},
                                       {at + "v_proj.weight", {s.kv_dim(), s.hidden}}};
      if (s.attn_gate) qkv.push_back({at + "q_proj.weight", {q_rows, s.hidden}, gate});
      t.add_layer(i, &LayerWeights::wqkv, "wqkv", qkv);
      if (s.qkv_bias) {
        std::vector<WeightSource> b = {{at + "q_proj.bias", {q_rows}, query},
                                       {at + "k_proj.bias", {s.kv_dim()}},
                                       {at + "v_proj.bias", {s.kv_dim()}}};
        if (s.attn_gate) b.push_back({at + "q_proj.bias", {q_rows}, gate});
        t.add_layer(i, &LayerWeights::bqkv, "bqkv", b);
      }
      t.add_layer(i, &LayerWeights::q_norm, "q_norm", {{at + "q_norm.weight", {D}}}, ones, kUnitOffsetNorm);
      t.add_layer(i, &LayerWeights::k_norm, "k_norm", {{at + "k_norm.weight", {D}}}, ones, kUnitOffsetNorm);
      t.add_layer(i, &LayerWeights::wo, "wo", {{at + "o_proj.weight", {s.hidden, s.q_dim()}}});
      if (s.o_bias) t.add_layer(i, &LayerWeights::bo, "bo", {{at + "o_proj.bias", {s.hidden}}});
    } else {
      const std::string la = hf + "linear_attn.";
      const int64_t C = l.conv_channels(), V = l.value_width(), H = l.v_heads;
      t.add_layer(i, &LayerWeights::lin_in, "lin_in",
                  {{la + "in_proj_qkv.weight", {C, s.hidden}},
                   {la + "in_proj_z.weight", {V, s.hidden}},
                   {la + "in_proj_b.weight", {H, s.hidden}},
                   {la + "in_proj_a.weight", {H, s.hidden}}});
      t.add_layer(i, &LayerWeights::lin_conv, "lin_conv", {{la + "conv1d.weight", {C, 1, l.conv_kernel}}},
                  WeightInit::Normal, {std::nullopt, 0.0f, Shape{C, l.conv_kernel}});
      t.add_layer(i, &LayerWeights::lin_a_log, "lin_a_log", {{la + "A_log", {H}}}, WeightInit::Normal,
                  {DType::F32, 0.0f, std::nullopt});
      t.add_layer(i, &LayerWeights::lin_dt_bias, "lin_dt_bias", {{la + "dt_bias", {H}}}, WeightInit::Normal,
                  {DType::F32, 0.0f, std::nullopt});
      t.add_layer(i, &LayerWeights::lin_norm, "lin_norm", {{la + "norm.weight", {l.v_dim}}}, ones);
      t.add_layer(i, &LayerWeights::lin_out, "lin_out", {{la + "out_proj.weight", {s.hidden, V}}});
    }
    t.add_layer(i, &LayerWeights::mlp_norm, "mlp_norm", {{hf + "post_attention_layernorm.weight", {s.hidden}}}, ones,
                kUnitOffsetNorm);
    t.add_layer(i, &LayerWeights::w_gate_up, "w_gate_up",
                {{mlp + "gate_proj.weight", {s.intermediate, s.hidden}}, {mlp + "up_proj.weight", {s.intermediate, s.hidden}}});
    t.add_layer(i, &LayerWeights::w_down, "w_down", {{mlp + "down_proj.weight", {s.hidden, s.intermediate}}});
  }
  t.ignore("model.visual.", "the vision tower: ingot runs the text model");
  t.ignore("mtp.", "the multi-token-prediction head, which transformers does not run either");
  return t;
}

void layer(ForwardContext& c, const LayerWeights& w, int i) {
  if (c.spec.kind(i) == LayerKind::Linear) linear_attention_block(c, w, i);
  else attention_block(c, w, i);
  mlp_block(c, w);
}

}  // namespace

extern const Family kQwen3_5TextFamily{"qwen3_5_text", 256, configure, weights, layer, nullptr, true};
extern const Family kQwen3_5Family{"qwen3_5", 256, configure, weights, layer, "text_config", true};

}  // namespace ingot
