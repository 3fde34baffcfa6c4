#include "models/layers.h"

#include <cmath>

namespace ingot {

namespace {
Mat rows(const Mat& m, int64_t T) { return {m.data, m.dtype, T, m.cols, m.ld}; }
// Rows [t0, t0 + n).
Mat slice_rows(const Mat& m, int64_t t0, int64_t n) {
  return {static_cast<uint8_t*>(m.data) + size_t(t0 * m.ld) * dtype_size(m.dtype), m.dtype, n, m.cols, m.ld};
}
// Columns [at, at + n) of the first T rows.
Mat cols(const Mat& m, int64_t T, int64_t at, int64_t n) {
  return {static_cast<uint8_t*>(m.data) + size_t(at) * dtype_size(m.dtype), m.dtype, T, n, m.ld};
}

// Folds the pending block output into the residual and normalises: the residual add of the previous
// block is fused into the next norm.
void norm_into_h(ForwardContext& c, const DevWeight& w) {
  Mat x = rows(c.x, c.T), d = rows(c.delta, c.T);
  c.be.add_rmsnorm(x, c.pending_delta ? &d : nullptr, w.data(), w.m.dtype, float(c.spec.rms_eps), rows(c.h, c.T));
  c.pending_delta = false;
}

// A block's output after a row-parallel projection: each rank holds its heads' (or its slice of the
// intermediate's) share of the sum; the one all-reduce of the block makes it whole on every rank.
void finish_block(ForwardContext& c) {
  if (c.comm) c.comm->all_reduce_sum(c.delta.data, c.T * c.delta.cols, c.delta.dtype);
  c.pending_delta = true;
}
}  // namespace

WeightTable decoder_weights(const ModelSpec& s) {
  WeightTable t;
  const WeightInit ones = WeightInit::Ones;
  t.add_model(&ModelWeights::embed, "tok_embeddings", {"model.embed_tokens.weight", {s.vocab, s.hidden}});
  t.add_model(&ModelWeights::final_norm, "final_norm", {"model.norm.weight", {s.hidden}}, ones);
  if (!s.tie_embeddings) t.add_model(&ModelWeights::lm_head, "lm_head", {"lm_head.weight", {s.lm_head_rows(), s.hidden}});
  for (int i = 0; i < s.layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".", at = hf + "self_attn.", mlp = hf + "mlp.";
    t.add_layer(i, &LayerWeights::attn_norm, "attn_norm", {{hf + "input_layernorm.weight", {s.hidden}}}, ones);
    t.add_layer(i, &LayerWeights::wqkv, "wqkv",
                {{at + "q_proj.weight", {s.q_dim(), s.hidden}},
                 {at + "k_proj.weight", {s.kv_dim(), s.hidden}},
                 {at + "v_proj.weight", {s.kv_dim(), s.hidden}}});
    if (s.qkv_bias)
      t.add_layer(i, &LayerWeights::bqkv, "bqkv",
                  {{at + "q_proj.bias", {s.q_dim()}}, {at + "k_proj.bias", {s.kv_dim()}}, {at + "v_proj.bias", {s.kv_dim()}}});
    if (s.qk_norm) {
      t.add_layer(i, &LayerWeights::q_norm, "q_norm", {{at + "q_norm.weight", {s.head_dim}}}, ones);
      t.add_layer(i, &LayerWeights::k_norm, "k_norm", {{at + "k_norm.weight", {s.head_dim}}}, ones);
    }
    t.add_layer(i, &LayerWeights::wo, "wo", {{at + "o_proj.weight", {s.hidden, s.q_dim()}}});
    if (s.o_bias) t.add_layer(i, &LayerWeights::bo, "bo", {{at + "o_proj.bias", {s.hidden}}});
    t.add_layer(i, &LayerWeights::mlp_norm, "mlp_norm", {{hf + "post_attention_layernorm.weight", {s.hidden}}}, ones);
    t.add_layer(i, &LayerWeights::w_gate_up, "w_gate_up",
                {{mlp + "gate_proj.weight", {s.intermediate, s.hidden}}, {mlp + "up_proj.weight", {s.intermediate, s.hidden}}});
    t.add_layer(i, &LayerWeights::w_down, "w_down", {{mlp + "down_proj.weight", {s.hidden, s.intermediate}}});
  }
  return t;
}

void qwen_sliding_windows(const ConfigFields& f, ModelSpec& s) {
  const std::string& src = f.src;
  bool use_sw = f.bool_or("use_sliding_window", false);
  int64_t sw = use_sw && f.has("sliding_window") ? f.positive_int("sliding_window") : 0;
  if (f.has("layer_types")) {
    const nlohmann::json& lt = f.j["layer_types"];
    if (!lt.is_array() || int64_t(lt.size()) != s.layers)
      throw Error(src + ": field 'layer_types' must list one entry per layer (" + std::to_string(s.layers) + ")");
    for (int64_t i = 0; i < s.layers; ++i) {
      if (!lt[i].is_string()) throw Error(src + ": layer_types[" + std::to_string(i) + "] must be a string");
      std::string t = lt[i];
      if (t == "sliding_attention") s.window[i] = sw;
      else if (t != "full_attention")
        throw Error(src + ": layer_types[" + std::to_string(i) + "] '" + t + "' is not supported");
    }
  } else if (sw > 0) {
    int64_t mwl = f.has("max_window_layers") ? f.nonnegative_int("max_window_layers") : 0;
    for (int64_t i = mwl; i < s.layers; ++i) s.window[i] = sw;
  }
}

void prenorm_decoder_layer(ForwardContext& c, const LayerWeights& w, int layer) {
  attention_block(c, w, layer);
  mlp_block(c, w);
}

void attention_block(ForwardContext& c, const LayerWeights& w, int layer) {
  const ModelSpec& s = c.spec;
  norm_into_h(c, *w.attn_norm);
  Mat qkv = rows(c.qkv, c.T);
  c.be.linear(rows(c.h, c.T), w.wqkv->m, w.bqkv ? w.bqkv->data() : nullptr, qkv);

  const KvLayerView& cache = c.state.kv(layer);
  RopeWriteParams rp;
  rp.qkv = cols(qkv, c.T, 0, s.q_dim() + 2 * s.kv_dim());  // the gates, if any, follow v
  rp.q_norm = w.q_norm ? w.q_norm->data() : nullptr;
  rp.k_norm = w.k_norm ? w.k_norm->data() : nullptr;
  rp.norm_dtype = w.q_norm ? w.q_norm->m.dtype : DType::F32;
  rp.norm_eps = float(s.rms_eps);
  rp.inv_freq = c.inv_freq;
  rp.rot_dim = int(s.rope_dim());
  rp.attn_scale = c.rope_scale;
  rp.q_heads = int(s.heads);
  rp.kv_heads = int(s.kv_heads);
  rp.head_dim = int(s.head_dim);
  rp.meta = c.meta;
  rp.cache = cache;
  c.be.rope_cache_write(rp);

  // Tokens [t0, t0 + n) of the call, from `nrows` distinct rows.
  auto attend = [&](int64_t t0, int64_t n, int nrows) {
    auto at = [&](const int32_t* a) { return a + t0; };
    AttentionParams ap;
    ap.q = slice_rows(cols(qkv, c.T, 0, s.q_dim()), t0, n);
    ap.out = slice_rows(c.attn, t0, n);
    ap.q_heads = int(s.heads);
    ap.kv_heads = int(s.kv_heads);
    ap.head_dim = int(s.head_dim);
    ap.window = int(s.window[size_t(layer)]);
    ap.scale = 1.0f / std::sqrt(float(s.head_dim));
    ap.max_kv_len = c.max_kv_len;
    ap.rows = nrows;
    ap.meta = {at(c.meta.row), at(c.meta.slot), at(c.meta.rope_pos), at(c.meta.kv_len)};
    // The ranking covers the call's leading one-token rows (Model::Prepared::order).
    if (t0 == 0 && n == c.single_rows) ap.meta.order = c.meta.order;
    ap.cache = cache;
    c.be.attention(ap);
  };
  const int64_t d = c.single_rows;
  if (d > 0 && d < c.T) {
    attend(0, d, int(d));
    attend(d, c.T - d, c.rows - int(d));
  } else {
    attend(0, c.T, c.rows);
  }
  const Mat attn = rows(c.attn, c.T);
  if (s.attn_gate) c.be.sigmoid_gate(attn, cols(qkv, c.T, s.q_dim() + 2 * s.kv_dim(), s.q_dim()), attn);

  c.be.linear(attn, w.wo->m, w.bo ? w.bo->data() : nullptr, rows(c.delta, c.T));
  finish_block(c);
}

void linear_attention_block(ForwardContext& c, const LayerWeights& w, int layer) {
  const LinearAttnSpec& l = c.spec.linear;
  const int64_t T = c.T, C = l.conv_channels(), K = l.key_width(), V = l.value_width(), H = l.v_heads;
  const LinearLayerView& st = c.state.linear(layer);
  norm_into_h(c, *w.attn_norm);
  const Mat in = rows(c.lin_in, T);  // qkv | z | b | a
  c.be.linear(rows(c.h, T), w.lin_in->m, nullptr, in);

  CausalConv1dParams cp;
  cp.x = cols(in, T, 0, C);
  cp.out = rows(c.lin_conv, T);
  cp.weight = w.lin_conv->data();
  cp.weight_dtype = w.lin_conv->m.dtype;
  cp.kernel = int(l.conv_kernel);
  cp.state = st.conv;
  cp.meta = c.meta;
  cp.rows = c.rows;
  c.be.causal_conv1d(cp);

  GatedDeltaRuleParams dp;
  dp.q = cols(cp.out, T, 0, K);
  dp.k = cols(cp.out, T, K, K);
  dp.v = cols(cp.out, T, 2 * K, V);
  dp.b = cols(in, T, C + V, H);
  dp.a = cols(in, T, C + V + H, H);
  dp.a_log = w.lin_a_log->data();
  dp.a_log_dtype = w.lin_a_log->m.dtype;
  dp.dt_bias = w.lin_dt_bias->data();
  dp.dt_bias_dtype = w.lin_dt_bias->m.dtype;
  dp.out = rows(c.lin_out, T);
  dp.k_heads = int(l.k_heads);
  dp.v_heads = int(l.v_heads);
  dp.d_k = int(l.k_dim);
  dp.d_v = int(l.v_dim);
  dp.state = st.recurrent;
  dp.meta = c.meta;
  dp.rows = c.rows;
  c.be.gated_delta_rule(dp);

  GatedRmsNormParams np;
  np.x = dp.out;
  np.z = cols(in, T, C, V);
  np.out = dp.out;
  np.weight = w.lin_norm->data();
  np.weight_dtype = w.lin_norm->m.dtype;
  np.heads = int(H);
  np.dim = int(l.v_dim);
  np.eps = float(c.spec.rms_eps);
  c.be.gated_rmsnorm(np);

  c.be.linear(dp.out, w.lin_out->m, nullptr, rows(c.delta, T));
  finish_block(c);
}

void mlp_block(ForwardContext& c, const LayerWeights& w) {
  norm_into_h(c, *w.mlp_norm);
  Mat gu = rows(c.gate_up, c.T), act = rows(c.act, c.T);
  if (!c.be.linear_swiglu(rows(c.h, c.T), w.w_gate_up->m, act)) {
    c.be.linear(rows(c.h, c.T), w.w_gate_up->m, nullptr, gu);
    c.be.swiglu(gu, act);
  }
  c.be.linear(act, w.w_down->m, nullptr, rows(c.delta, c.T));
  finish_block(c);
}

void decoder_forward(ForwardContext& c, const Family& family, const ModelWeights& w, const int32_t* ids) {
  c.be.embedding(w.embed->m, ids, rows(c.x, c.T));
  for (int l = 0; l < int(c.spec.layers); ++l) family.layer(c, w.layers[size_t(l)], l);
  norm_into_h(c, *w.final_norm);  // over every token: the rows the LM head reads are picked afterwards
}

void lm_head(Backend& be, const ModelWeights& w, const Mat& h, const Mat& logits) {
  be.linear(h, w.lm_head->m, nullptr, logits);
}

}  // namespace ingot
