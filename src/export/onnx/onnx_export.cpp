#include "export/onnx/onnx_export.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <system_error>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "export/onnx/graph_builder.h"
#include "export/onnx/linear_attention_graph.h"
#include "io/engine.h"
#include "io/model_config.h"
#include "models/rope.h"

namespace fs = std::filesystem;

namespace ingot::onnx_export {

namespace {

constexpr const char* kModelFile = "model.onnx";
constexpr const char* kDataFile = "model.onnx.data";
constexpr const char* kContractFile = "ingot_export.json";
// Copied beside the graph when the checkpoint has them: what a caller needs to tokenize, render chats
// and stop.
constexpr const char* kSideFiles[] = {"config.json",          "generation_config.json", "tokenizer.json",
                                      "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                      "chat_template.json"};

int64_t opset_of(Target t) { return t == Target::OnnxRuntime ? 24 : 17; }
// IR 11 is what ONNX 1.18+ writes for opsets 23/24; IR 8 (ONNX 1.12) for opset 17, which every TensorRT
// parser since 8.6 reads.
int64_t ir_of(Target t) { return t == Target::OnnxRuntime ? 11 : 8; }

// The caches are kept in the weight dtype, except bf16 exports, whose caches are f32: ONNX Runtime's
// JavaScript binding (the CI's runtime) has no bfloat16 tensor type to feed or read a bf16 cache with.
DType cache_dtype(DType weights) { return weights == DType::BF16 ? DType::F32 : weights; }

Attr ai(const char* n, int64_t v) { return {n, v}; }
Attr af(const char* n, float v) { return {n, v}; }
Attr as(const char* n, std::string v) { return {n, std::move(v)}; }
Attr ints(const char* n, std::vector<int64_t> v) { return {n, std::move(v)}; }

// The decoder graph of one engine. With f32 compute (the default) activations are f32 whatever the weight
// dtype: 16-bit weights are stored 16-bit and widened by a Cast at their use (runtimes fold it at load),
// as ingot's own CPU reference computes. With f16 compute (f16 weights) the residual stream, every
// projection, attention's matmuls and the MLP are f16, and the reductions that lose digits in f16 (the
// norms, the decomposed softmax) plus RoPE and Qwen3.5's conv/delta rule run in f32 between Casts. The
// caches are stored in cache_dtype(weight dtype); logits are f32 in every export.
class DecoderGraph {
 public:
  DecoderGraph(GraphBuilder& g, const Engine& e, const ExportOptions& o, int64_t capacity)
      : g_(g), e_(e), s_(e.spec), o_(o), cap_(capacity), cache_dt_(cache_dtype(e.weight_dtype)), act_(o.compute) {}

  void build() {
    const OnnxType cache_t = onnx_type(cache_dt_);
    g_.input("input_ids", OnnxType::Int64, {std::string("batch"), std::string("sequence")});
    g_.input("write_indices", OnnxType::Int64, {std::string("batch")});
    for (int64_t i = 0; i < s_.layers; ++i) {
      if (s_.kind(i) == LayerKind::Linear) {  // Qwen3.5's linear layers: f32 states, as the runtime's
        g_.input(state_name("past", "conv", i), OnnxType::Float, conv_dims());
        g_.input(state_name("past", "recurrent", i), OnnxType::Float, recurrent_dims());
        continue;
      }
      for (const char* kv : {"key", "value"}) g_.input(past_name(i, kv), cache_t, cache_dims());
    }

    ids_shape_ = g_.op("Shape", {"input_ids"}, {}, "ids_shape");  // [2] = (B, S)
    seq_ = g_.op("Gather", {ids_shape_, g_.scalar_i64(1, "one")}, {ai("axis", 0)}, "seq_len");  // scalar S
    positions();
    masks();
    // x [N, hidden], N = B*S tokens, token-major like the runtime's packed activations.
    const std::string ids_flat = g_.op("Reshape", {"input_ids", g_.const_i64({-1}, "flat")}, {}, "ids_flat");
    // x [N, hidden] in the compute dtype: the residual stream.
    std::string x = g_.op("Gather", {mm_weight("tok_embeddings"), ids_flat}, {ai("axis", 0)}, "embed");
    for (int64_t i = 0; i < s_.layers; ++i) x = layer(x, i);
    const std::string h = rmsnorm(x, weight("final_norm"), "final_norm");
    const std::string head = s_.tie_embeddings ? mm_weight("tok_embeddings") : mm_weight("lm_head");
    // [N, vocab], float32 whatever the compute dtype (the contract's logits)
    const std::string logits2 = to_f32(g_.op("Gemm", {h, head}, {ai("transB", 1)}, "logits2d"));
    const std::string lshape = g_.op("Concat", {ids_shape_, g_.const_i64({s_.vocab}, "vocab")}, {ai("axis", 0)});
    g_.node_named("Reshape", {logits2, lshape}, {"logits"});
    g_.output("logits", OnnxType::Float, {std::string("batch"), std::string("sequence"), s_.vocab});
    for (int64_t i = 0; i < s_.layers; ++i) {
      if (s_.kind(i) == LayerKind::Linear) {
        g_.output(state_name("present", "conv", i), OnnxType::Float, conv_dims());
        g_.output(state_name("present", "recurrent", i), OnnxType::Float, recurrent_dims());
        continue;
      }
      for (const char* kv : {"key", "value"}) g_.output(present_name(i, kv), cache_t, cache_dims());
    }
  }

  static std::string past_name(int64_t i, const char* kv) {
    return "past_key_values." + std::to_string(i) + "." + kv;
  }
  static std::string present_name(int64_t i, const char* kv) { return "present." + std::to_string(i) + "." + kv; }
  // past_conv_state.{i}, present_recurrent_state.{i}, ...
  static std::string state_name(const char* when, const char* what, int64_t i) {
    return std::string(when) + "_" + what + "_state." + std::to_string(i);
  }

 private:
  bool heads_first() const { return o_.layout == CacheLayout::HeadsFirst; }
  std::vector<Dim> cache_dims() const {
    if (heads_first()) return {std::string("batch"), s_.kv_heads, cap_, s_.head_dim};
    return {std::string("batch"), cap_, s_.kv_dim()};
  }
  std::vector<Dim> conv_dims() const {  // [B, conv channels, kernel - 1]
    return {std::string("batch"), s_.linear.conv_channels(), s_.linear.conv_kernel - 1};
  }
  std::vector<Dim> recurrent_dims() const {  // [B, v_heads, d_k, d_v]
    return {std::string("batch"), s_.linear.v_heads, s_.linear.k_dim, s_.linear.v_dim};
  }

  // The runtime weight `name` as a value of dtype `dt` (stored once as the engine holds it; a Cast where
  // the dtypes differ, which runtimes fold at load).
  std::string weight_as(const std::string& name, DType dt) {
    auto it = weights_.find({name, dt});
    if (it != weights_.end()) return it->second;
    const HostTensor& t = e_.get(name);
    auto stored = weights_.find({name, t.dtype()});
    std::string v = stored != weights_.end() ? stored->second
                                             : (weights_[{name, t.dtype()}] = g_.weight(name, t.dtype(), t.shape(), t.data()));
    if (t.dtype() != dt) v = g_.op("Cast", {v}, {ai("to", int64_t(onnx_type(dt)))}, name + "_" + std::string(dtype_name(dt)));
    return weights_[{name, dt}] = v;
  }
  // f32: norms, RoPE-side and linear-attention weights. mm_weight: what a matmul in the compute dtype reads.
  std::string weight(const std::string& name) { return weight_as(name, DType::F32); }
  std::string mm_weight(const std::string& name) { return weight_as(name, act_); }
  std::string optional_mm_weight(const std::string& name) { return e_.find(name) ? mm_weight(name) : std::string(); }

  // Casts between f32 and the compute dtype (no node when they agree).
  std::string cast(const std::string& x, DType from, DType to, const char* hint) {
    if (from == to) return x;
    return g_.op("Cast", {x}, {ai("to", int64_t(onnx_type(to)))}, hint);
  }
  std::string to_f32(const std::string& x) { return cast(x, act_, DType::F32, "to_f32"); }
  std::string to_act(const std::string& x) { return cast(x, DType::F32, act_, "to_act"); }

  // ReduceMean over the last axis: axes an attribute before opset 18, an input from 18 on.
  std::string mean_last(const std::string& x) {
    if (g_.opset() >= 18)
      return g_.op("ReduceMean", {x, g_.const_i64({-1}, "axes")}, {ai("keepdims", 1)}, "mean");
    return g_.op("ReduceMean", {x}, {ints("axes", {-1}), ai("keepdims", 1)}, "mean");
  }

  // RMSNorm over the last axis in f32, in transformers' order: w * (x * 1/sqrt(mean(x^2) + eps)). Input and
  // output in the compute dtype; with f16 compute the sum of squares would lose digits (and overflow past
  // 256 per element), so the norm runs in f32 between Casts, as transformers' Qwen/Llama norms do.
  std::string rmsnorm(const std::string& x_act, const std::string& w, const std::string& hint) {
    return to_act(rmsnorm_f32(x_act, w, hint));
  }
  // The same, its output left in f32 (q/k norms feed RoPE, which runs in f32: one rounding, not two).
  std::string rmsnorm_f32(const std::string& x_act, const std::string& w, const std::string& hint) {
    const std::string x = to_f32(x_act);
    const std::string ms = mean_last(g_.op("Mul", {x, x}, {}, hint + "_sq"));
    const std::string inv =
        g_.op("Reciprocal", {g_.op("Sqrt", {g_.op("Add", {ms, eps_})}, {}, hint + "_rms")}, {}, hint + "_inv");
    return g_.op("Mul", {w, g_.op("Mul", {x, inv})}, {}, hint);
  }

  // positions [B, S] = write_indices[b] + s (the RoPE position is the slot, as in the runtime when a row
  // brings no explicit positions), and the RoPE tables from it.
  void positions() {
    eps_ = g_.scalar_f32(float(s_.rms_eps), "eps");
    const std::string steps =
        g_.op("Range", {g_.scalar_i64(0, "zero"), seq_, g_.scalar_i64(1, "one")}, {}, "steps");  // [S]
    const std::string wi = g_.op("Unsqueeze", {"write_indices", g_.const_i64({1}, "axes")}, {}, "wi_col");  // [B,1]
    pos_ = g_.op("Add", {wi, steps}, {}, "positions");  // [B, S]
    // Angles in f32 as the CPU reference forms them: float(pos) * inv_freq[i].
    const std::vector<float> inv = rope_inv_freq(s_);
    const std::string invf = g_.const_f32(inv, {int64_t(inv.size())}, "inv_freq");
    const std::string posf = g_.op("Cast", {pos_}, {ai("to", int64_t(OnnxType::Float))}, "pos_f32");
    const std::string ang =
        g_.op("Mul", {g_.op("Unsqueeze", {posf, g_.const_i64({2}, "axes")}), invf}, {}, "angles");  // [B,S,half]
    const std::string scale = g_.scalar_f32(rope_attention_scale(s_), "rope_scale");
    auto table = [&](const char* fn) {
      const std::string half = g_.op("Mul", {g_.op(fn, {ang}), scale}, {}, fn);
      const std::string full = g_.op("Concat", {half, half}, {ai("axis", -1)});          // [B, S, rope_dim]
      return g_.op("Unsqueeze", {full, g_.const_i64({2}, "axes")}, {}, std::string(fn) + "_table");  // [B,S,1,rd]
    };
    cos_ = table("Cos");
    sin_ = table("Sin");
  }

  // Additive masks [B, 1, S, capacity] (0 visible, lowest f32 hidden) from the indices, never a causal
  // flag: query at slot p sees key slot j iff j <= p, j < write_index + S and, on a sliding layer,
  // j > p - window. One mask per distinct window.
  void masks() {
    std::vector<int64_t> slots(static_cast<size_t>(cap_), 0);
    for (int64_t j = 0; j < cap_; ++j) slots[size_t(j)] = j;
    const std::string key = g_.const_i64(slots, "key_slots");  // [C]
    const std::string p4 = g_.op("Unsqueeze", {pos_, g_.const_i64({1, 3}, "axes")}, {}, "q_slot");  // [B,1,S,1]
    const std::string kv_len = g_.op("Add", {"write_indices", seq_}, {}, "kv_len");                    // [B]
    const std::string len4 = g_.op("Unsqueeze", {kv_len, g_.const_i64({1, 2, 3}, "axes")}, {}, "kv_len4");
    const std::string causal = g_.op("LessOrEqual", {key, p4}, {}, "causal");  // [B,1,S,C]
    const std::string valid = g_.op("Less", {key, len4}, {}, "valid");        // [B,1,1,C]
    const std::string full = g_.op("And", {causal, valid}, {}, "visible");
    const std::string zero = g_.scalar_f32(0.0f, "zero_f");
    const std::string hidden = g_.scalar_f32(std::numeric_limits<float>::lowest(), "hidden");
    for (int64_t w : s_.window) {
      if (mask_.count(w)) continue;
      std::string vis = full;
      if (w > 0) {
        const std::string lo = g_.op("Sub", {p4, g_.scalar_i64(w, "window")}, {}, "window_lo");
        vis = g_.op("And", {full, g_.op("Greater", {key, lo}, {}, "in_window")}, {}, "visible_window");
      }
      mask_[w] = g_.op("Where", {vis, zero, hidden}, {}, w > 0 ? "mask_window" : "mask");
    }
  }

  // x [B,S,h,hd] rotated in place of transformers' rotate_half: x*cos + concat(-x2, x1)*sin over the
  // first rope_dim dims; the rest (partial rotary, Qwen3.5) pass through unchanged.
  // f32 in and out (the tables are f32).
  std::string rope(const std::string& x_in, const std::string& hint) {
    const int64_t rd = s_.rope_dim(), half = rd / 2, pass = s_.head_dim - rd;
    std::string x = x_in, rest;
    if (pass > 0) {
      auto p = g_.node("Split", {x_in, g_.const_i64({rd, pass}, "split")}, 2, {ai("axis", -1)}, hint + "_rotary");
      x = p[0];
      rest = p[1];
    }
    auto parts = g_.node("Split", {x, g_.const_i64({half, half}, "split")}, 2, {ai("axis", -1)}, hint + "_half");
    const std::string rot = g_.op("Concat", {g_.op("Neg", {parts[1]}), parts[0]}, {ai("axis", -1)}, hint + "_rot");
    const std::string y = g_.op("Add", {g_.op("Mul", {x, cos_}), g_.op("Mul", {rot, sin_})}, {}, hint + "_rope");
    return pass > 0 ? g_.op("Concat", {y, rest}, {ai("axis", -1)}, hint + "_rope_full") : y;
  }

  std::string linear(const std::string& x, const std::string& w, const std::string& b, const std::string& hint) {
    std::vector<std::string> in{x, w};
    if (!b.empty()) in.push_back(b);
    return g_.op("Gemm", in, {ai("transB", 1)}, hint);  // x [N, in] · w[out, in]^T (+ b) -> [N, out]
  }

  std::string to_cache(const std::string& x) { return cast(x, act_, cache_dt_, "to_cache"); }
  std::string from_cache(const std::string& x) { return cast(x, cache_dt_, act_, "from_cache"); }

  // Writes the chunk's K or V (x4 [B,S,kv_heads,hd], after RoPE for K) at slots write_index.. of the
  // cache; returns the cache in the compute dtype, [B, kv_heads, capacity, hd], for attention.
  std::string cache_update(const std::string& x4, int64_t layer, const char* kv) {
    std::string upd;  // heads-first [B,kvh,S,hd] (slots on axis 2), flattened [B,S,kvh*hd] (axis 1)
    if (heads_first()) upd = g_.op("Transpose", {x4}, {ints("perm", {0, 2, 1, 3})}, "kv_heads_first");
    else upd = g_.op("Reshape", {x4, g_.const_i64({0, 0, -1}, "flat_kv")}, {}, "kv_flat");
    upd = to_cache(upd);
    const int64_t axis = heads_first() ? 2 : 1;
    const std::string present = present_name(layer, kv);
    if (o_.target == Target::OnnxRuntime) {
      // TensorScatter (opset 24): present = past with upd written at write_indices[b] + s on `axis`; a
      // runtime may bind one buffer as past and present.
      g_.node_named("TensorScatter", {past_name(layer, kv), upd, "write_indices"}, {present},
                    {ai("axis", axis), as("mode", "linear")});
    } else {
      // ScatterElements with indices [same shape as upd] = positions broadcast over heads and dims.
      const std::string p = heads_first() ? g_.op("Unsqueeze", {pos_, g_.const_i64({1, 3}, "axes")})   // [B,1,S,1]
                                          : g_.op("Unsqueeze", {pos_, g_.const_i64({2}, "axes")});     // [B,S,1]
      const std::string idx = g_.op("Expand", {p, g_.op("Shape", {upd})}, {}, "scatter_idx");
      g_.node_named("ScatterElements", {past_name(layer, kv), idx, upd}, {present}, {ai("axis", axis)});
    }
    std::string c = from_cache(present);
    if (!heads_first()) {
      c = g_.op("Reshape", {c, g_.const_i64({0, 0, s_.kv_heads, s_.head_dim}, "kv4")}, {}, "kv_unflat");
      c = g_.op("Transpose", {c}, {ints("perm", {0, 2, 1, 3})}, "kv_heads_first");  // [B,kvh,C,hd]
    }
    return c;
  }

  // q [B,heads,S,hd], k/v [B,kv_heads,C,hd] -> [B,heads,S,hd], all in the compute dtype.
  std::string attention(const std::string& q, const std::string& k, const std::string& v, int64_t window) {
    const float scale = 1.0f / std::sqrt(float(s_.head_dim));
    if (o_.target == Target::OnnxRuntime)  // grouped-query natively (q_heads a multiple of kv_heads)
      // With f16 compute the op gets f32 copies of q, k and v: ONNX Runtime 1.30's CPU kernel computes an f16
      // Attention in f16 whatever softmax_precision says (measured: 2.21e-2 max |dlogit| on models/demo,
      // over the 16-bit bound, against 1.17e-2 with f32 inputs, the decomposed form's figure).
      return to_act(g_.op("Attention", {to_f32(q), to_f32(k), to_f32(v), mask_.at(window)}, {af("scale", scale)}, "attn"));
    const std::string& mask = mask_.at(window);
    std::string kk = k, vv = v;
    const int64_t group = s_.heads / s_.kv_heads;
    if (group > 1) {  // repeat each kv head for its group of query heads: [B,kvh,C,hd] -> [B,heads,C,hd]
      auto repeat = [&](const std::string& x) {
        const std::string u = g_.op("Unsqueeze", {x, g_.const_i64({2}, "axes")});  // [B,kvh,1,C,hd]
        const std::string e = g_.op("Expand", {u, g_.const_i64({1, 1, group, 1, 1}, "group")});
        return g_.op("Reshape", {e, g_.const_i64({0, s_.heads, cap_, s_.head_dim}, "rep")}, {}, "kv_repeat");
      };
      kk = repeat(k);
      vv = repeat(v);
    }
    const std::string kt = g_.op("Transpose", {kk}, {ints("perm", {0, 1, 3, 2})}, "k_t");  // [B,heads,hd,C]
    // [B,heads,S,C]; scaled, masked and normalised in f32 (an f16 softmax's sum would lose digits over
    // long rows), the probabilities back in the compute dtype for the second matmul.
    std::string sc = to_f32(g_.op("MatMul", {q, kt}, {}, "scores"));
    sc = g_.op("Add", {g_.op("Mul", {sc, g_.scalar_f32(scale, "scale")}), mask}, {}, "scores_masked");
    const std::string p = to_act(g_.op("Softmax", {sc}, {ai("axis", -1)}, "probs"));
    return g_.op("MatMul", {p, vv}, {}, "attn");
  }

  // Qwen3.5's linear-attention mixer (linear_attention_graph.cpp): h [N, hidden] -> [N, hidden].
  std::string linear_mixer(const std::string& h, int64_t i) {
    const std::string L = "layers." + std::to_string(i) + ".";
    // [N, C + V + 2*v_heads]; the conv and the delta rule run in f32 whatever the compute dtype, as the
    // runtime keeps their state.
    const std::string proj = to_f32(linear(h, mm_weight(L + "lin_in"), "", "lin_in"));
    LinearAttnWeights w{weight(L + "lin_conv"), weight(L + "lin_a_log"), weight(L + "lin_dt_bias"), weight(L + "lin_norm")};
    LinearAttnContext c{ids_shape_, "write_indices", eps_,
                        state_name("past", "conv", i), state_name("present", "conv", i),
                        state_name("past", "recurrent", i), state_name("present", "recurrent", i)};
    return linear(to_act(linear_attention(g_, s_, w, c, proj, i)), mm_weight(L + "lin_out"), "", "lin_out");
  }

  std::string layer(const std::string& x_in, int64_t i) {
    const std::string L = "layers." + std::to_string(i) + ".";
    const std::string h = rmsnorm(x_in, weight(L + "attn_norm"), "attn_norm");
    if (s_.kind(i) == LayerKind::Linear) return mlp(g_.op("Add", {x_in, linear_mixer(h, i)}, {}, "resid"), i);
    // [N, q + 2kv (+ q: the output gate's rows, gated attention)]
    const std::string qkv = linear(h, mm_weight(L + "wqkv"), optional_mm_weight(L + "bqkv"), "qkv");
    std::vector<int64_t> widths{s_.q_dim(), s_.kv_dim(), s_.kv_dim()};
    if (s_.attn_gate) widths.push_back(s_.q_dim());
    auto parts = g_.node("Split", {qkv, g_.const_i64(widths, "split")}, int(widths.size()), {ai("axis", 1)}, "qkv_part");
    auto heads4 = [&](const std::string& x, int64_t n) {  // [N, n*hd] -> [B, S, n, hd]
      const std::string shape = g_.op("Concat", {ids_shape_, g_.const_i64({n, s_.head_dim}, "heads")}, {ai("axis", 0)});
      return g_.op("Reshape", {x, shape}, {}, "heads4");
    };
    std::string q = heads4(parts[0], s_.heads), k = heads4(parts[1], s_.kv_heads), v = heads4(parts[2], s_.kv_heads);
    // q/k norm (Qwen3, Qwen3.5: per-head RMSNorm over head_dim) and RoPE in f32, back to the compute
    // dtype once, as the runtime's fused rope_cache_write rounds once.
    std::string qf = to_f32(q), kf = to_f32(k);
    if (s_.qk_norm) {
      qf = rmsnorm_f32(q, weight(L + "q_norm"), "q_norm");
      kf = rmsnorm_f32(k, weight(L + "k_norm"), "k_norm");
    }
    q = to_act(rope(qf, "q"));
    k = to_act(rope(kf, "k"));
    const std::string kc = cache_update(k, i, "key"), vc = cache_update(v, i, "value");
    const std::string qt = g_.op("Transpose", {q}, {ints("perm", {0, 2, 1, 3})}, "q_heads_first");  // [B,h,S,hd]
    const std::string y = attention(qt, kc, vc, s_.window[size_t(i)]);
    std::string y2 = g_.op("Reshape", {g_.op("Transpose", {y}, {ints("perm", {0, 2, 1, 3})}),
                                       g_.const_i64({-1, s_.q_dim()}, "attn2d")},
                           {}, "attn_out");  // [N, q_dim]
    if (s_.attn_gate) y2 = g_.op("Mul", {y2, g_.op("Sigmoid", {parts[3]})}, {}, "attn_gated");  // Qwen3.5: before o_proj
    const std::string x = g_.op("Add", {x_in, linear(y2, mm_weight(L + "wo"), optional_mm_weight(L + "bo"), "o_proj")}, {}, "resid");
    return mlp(x, i);
  }

  // The SwiGLU MLP block with its residual: x [N, hidden] -> [N, hidden].
  std::string mlp(const std::string& x, int64_t i) {
    const std::string L = "layers." + std::to_string(i) + ".";
    const std::string h2 = rmsnorm(x, weight(L + "mlp_norm"), "mlp_norm");
    const std::string gu = linear(h2, mm_weight(L + "w_gate_up"), "", "gate_up");  // [N, 2*intermediate]
    auto g_u = g_.node("Split", {gu, g_.const_i64({s_.intermediate, s_.intermediate}, "split")}, 2, {ai("axis", 1)},
                       "gate_up_part");
    const std::string act = g_.op("Mul", {g_.op("Mul", {g_u[0], g_.op("Sigmoid", {g_u[0]})}, {}, "silu"), g_u[1]});
    return g_.op("Add", {x, linear(act, mm_weight(L + "w_down"), "", "down")}, {}, "resid");
  }

  GraphBuilder& g_;
  const Engine& e_;
  const ModelSpec& s_;
  const ExportOptions& o_;
  int64_t cap_;
  DType cache_dt_;
  DType act_;  // the compute dtype: F32 or F16
  std::map<std::pair<std::string, DType>, std::string> weights_;  // (engine name, dtype) -> value
  std::map<int64_t, std::string> mask_;  // per window: the f32 additive mask
  std::string ids_shape_, seq_, pos_, cos_, sin_, eps_;
};

bool is_export_dir(const fs::path& p) { return fs::is_directory(p) && fs::is_regular_file(p / kContractFile); }

// A temporary folder beside the output, removed unless committed.
class TempDir {
 public:
  explicit TempDir(const fs::path& out) {
    const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
    std::string name = ".";  // built by appends: GCC 12 warns falsely (-Wrestrict) on "." + string
    name += out.filename().string();
    name += ".tmp-XXXXXX";
    std::string tmpl = (parent / name).string();
    if (!mkdtemp(tmpl.data()))
      throw Error("export: cannot write in folder " + parent.string() + ": " + std::strerror(errno));
    path_ = tmpl;
    // mkdtemp makes the folder 0700; the export is an ordinary output folder, so it gets the umask's
    // permissions like any other.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    fs::permissions(path_, fs::perms(0777 & ~mask));
  }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  // Renames the folder onto `out` (an earlier export there is moved aside first, then removed).
  void commit(const fs::path& out) {
    fs::path old;
    if (fs::exists(out)) {
      old = path_.string() + ".old";
      fs::rename(out, old);
    }
    fs::rename(path_, out);
    path_.clear();
    if (!old.empty()) fs::remove_all(old);
  }

 private:
  fs::path path_;
};

nlohmann::json contract(const ModelSpec& s, const ExportOptions& o, DType dt, int64_t cap,
                        const std::vector<std::string>& ops, const std::vector<std::string>& side_files) {
  using nlohmann::json;
  const std::string cdt = std::string(dtype_name(dt));
  const DType cache_dt = cache_dtype(dt);
  const bool hf = o.layout == CacheLayout::HeadsFirst;
  const json cache_shape = hf ? json::array({"batch", s.kv_heads, cap, s.head_dim}) : json::array({"batch", cap, s.kv_dim()});
  json inputs = json::array(), outputs = json::array();
  inputs.push_back({{"name", "input_ids"}, {"dtype", "int64"}, {"shape", {"batch", "sequence"}}});
  inputs.push_back({{"name", "write_indices"}, {"dtype", "int64"}, {"shape", {"batch"}}});
  outputs.push_back({{"name", "logits"}, {"dtype", "float32"}, {"shape", {"batch", "sequence", s.vocab}}});
  const char* onnx_dt = cache_dt == DType::F32 ? "float32" : "float16";
  const LinearAttnSpec& l = s.linear;
  const json conv_shape = json::array({"batch", l.conv_channels(), l.conv_kernel - 1});
  const json rec_shape = json::array({"batch", l.v_heads, l.k_dim, l.v_dim});
  json linear_layers = json::array();
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string n = std::to_string(i);
    if (s.kind(i) == LayerKind::Linear) {
      linear_layers.push_back(i);
      inputs.push_back({{"name", "past_conv_state." + n}, {"dtype", "float32"}, {"shape", conv_shape}});
      inputs.push_back({{"name", "past_recurrent_state." + n}, {"dtype", "float32"}, {"shape", rec_shape}});
      outputs.push_back({{"name", "present_conv_state." + n}, {"dtype", "float32"}, {"shape", conv_shape}});
      outputs.push_back({{"name", "present_recurrent_state." + n}, {"dtype", "float32"}, {"shape", rec_shape}});
      continue;
    }
    for (const char* kv : {"key", "value"}) {
      inputs.push_back({{"name", "past_key_values." + n + "." + kv}, {"dtype", onnx_dt}, {"shape", cache_shape}});
      outputs.push_back({{"name", "present." + n + "." + kv}, {"dtype", onnx_dt}, {"shape", cache_shape}});
    }
  }
  json windows = json::array();
  for (int64_t w : s.window) windows.push_back(w);
  json out = {
      {"format", "ingot-onnx-export"},
      {"format_version", 1},
      {"model", "model.onnx"},
      {"external_data", "model.onnx.data"},
      {"target", target_name(o.target)},
      {"opset", opset_of(o.target)},
      {"ir_version", ir_of(o.target)},
      {"ops", ops},
      {"family", s.family},
      {"weight_dtype", cdt},
      {"compute_dtype", std::string(dtype_name(o.compute))},
      {"cache",
       {{"layout", layout_name(o.layout)},
        {"dtype", onnx_dt},
        {"capacity", cap},
        {"max_batch", o.max_batch},
        {"kv_heads", s.kv_heads},
        {"head_dim", s.head_dim},
        {"sequence_axis", hf ? 2 : 1},
        {"write", "present = past with the chunk's K/V at slots write_indices[b] .. write_indices[b] + S - 1 "
                  "on the sequence axis; every other slot unchanged; write_indices[b] + S <= capacity"}}},
      {"mask",
       {{"rule", "query at slot p = write_indices[b] + s sees key slot j iff j <= p and j < write_indices[b] + S "
                 "and, on a sliding layer, j > p - window"},
        {"rope_position", "the slot: write_indices[b] + s"},
        {"window", windows}}},
      {"inputs", inputs},
      {"outputs", outputs},
      {"eos_token_ids", s.eos_ids},
      {"bos_token_id", s.bos_id ? json(*s.bos_id) : json(nullptr)},
      {"vocab_size", s.vocab},
      {"files", side_files},
  };
  if (!linear_layers.empty())
    out["linear_state"] = {
        {"layers", linear_layers},
        {"dtype", "float32"},
        {"conv_shape", conv_shape},
        {"recurrent_shape", rec_shape},
        {"write", "every row of the call replaces its whole state: present_conv_state = the last kernel-1 conv "
                  "inputs (slots below 0 read as zeros), present_recurrent_state = the delta rule's state after "
                  "the chunk's tokens, one token at a time; a row at write index 0 starts from zeros (its past state "
                  "is not read), a row at w > 0 must bring the state its first w tokens left"}};
  return out;
}

}  // namespace

std::string target_name(Target t) { return t == Target::OnnxRuntime ? "onnxruntime" : "tensorrt"; }

Target parse_target(const std::string& s) {
  if (s == "onnxruntime") return Target::OnnxRuntime;
  if (s == "tensorrt") return Target::TensorRT;
  throw Error("--target: '" + s + "' is not a target; use onnxruntime or tensorrt");
}

ModelSpec check_export(const std::string& model_dir, const std::string& out_dir, const ExportOptions& o) {
  const ModelSpec s = load_model_spec(model_dir);
  // A family the graph writer has not been taught (a new one in the registry) is refused by name.
  static const char* const kExportable[] = {"llama", "qwen2", "qwen3", "qwen3_5_text", "qwen3_5"};
  if (std::find(std::begin(kExportable), std::end(kExportable), s.family) == std::end(kExportable))
    throw Error("export: model_type '" + s.family + "' (" + model_dir +
                "/config.json) cannot be exported to ONNX yet; supported: llama, qwen2, qwen3, qwen3_5_text, qwen3_5");
  if (s.rope_dim() < 2 || s.rope_dim() > s.head_dim || s.rope_dim() % 2 != 0)
    throw Error("export: " + model_dir + ": rotary dim " + std::to_string(s.rope_dim()) + " of head_dim " +
                std::to_string(s.head_dim) + " cannot be exported (it must be even, 2 .. head_dim)");
  if (o.compute == DType::BF16)
    throw Error("--compute bf16: not written; ONNX Runtime's CPU provider (the CI's runtime) has no bfloat16 "
                "MatMul/Gemm kernels and its JavaScript binding no bfloat16 tensors, so such a graph could not be "
                "proven here; use --compute fp32 (bf16 weights, f32 arithmetic)");
  if (o.compute == DType::F16 && o.dtype != DType::F16)
    throw Error("--compute fp16 needs --dtype fp16 (f16 weights feed the f16 matmuls)");
  if (o.compute != DType::F32 && o.compute != DType::F16)
    throw Error("--compute: " + std::string(dtype_name(o.compute)) + " is not an arithmetic dtype; use fp32 or fp16");
  if (o.max_batch < 1 || o.max_batch > kMaxBatch)
    throw Error("--max-batch: must be between 1 and " + std::to_string(kMaxBatch) + " (got " + std::to_string(o.max_batch) + ")");
  if (o.capacity < 0 || o.capacity > kMaxCapacity)
    throw Error("--capacity: must be between 1 and " + std::to_string(kMaxCapacity) + " (got " + std::to_string(o.capacity) + ")");
  if (out_dir.empty()) throw Error("-o: give the export folder");
  const fs::path out(out_dir);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec))) {
    if (!is_export_dir(out))
      throw Error("-o " + out_dir + " exists and is not an earlier ONNX export (no " + kContractFile +
                  "); export into a new folder");
    if (!o.force) throw Error("-o " + out_dir + " holds an earlier export; give --force to replace it");
    if (fs::equivalent(out, fs::path(model_dir), ec))
      throw Error("-o " + out_dir + " is the model folder, an input of this command");
  }
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(parent)) throw Error("-o " + out_dir + ": folder " + parent.string() + " does not exist");
  return s;
}

ExportResult export_onnx(const std::string& model_dir, const std::string& out_dir, const ExportOptions& o) {
  ExportResult r;
  r.spec = check_export(model_dir, out_dir, o);
  r.capacity = o.capacity ? o.capacity : default_capacity(r.spec);
  if (r.capacity > r.spec.max_position)
    std::fprintf(stderr, "warning: --capacity %lld exceeds the model's max_position_embeddings %lld: positions "
                 "beyond it were not trained, output there degrades\n",
                 (long long)r.capacity, (long long)r.spec.max_position);
  r.out_dir = out_dir;
  TempDir tmp{fs::path(out_dir)};
  BuildOptions bo;
  bo.dtype = o.dtype;
  const Engine engine = build_engine(model_dir, bo);
  r.dtype = engine.weight_dtype;
  {
    GraphBuilder g("ingot_" + engine.spec.family, opset_of(o.target), ir_of(o.target),
                   (tmp.path() / kDataFile).string(), kDataFile);
    DecoderGraph(g, engine, o, r.capacity).build();
    g.save((tmp.path() / kModelFile).string(), INGOT_VERSION);
    r.nodes = g.node_count();
    r.ops = g.op_types();
    r.weight_bytes = g.data_bytes();
  }
  std::vector<std::string> side;
  for (const char* f : kSideFiles) {
    const fs::path src = fs::path(model_dir) / f;
    if (!fs::is_regular_file(src)) continue;
    fs::copy_file(src, tmp.path() / f);
    side.push_back(f);
  }
  {
    std::ofstream c(tmp.path() / kContractFile);
    c << contract(engine.spec, o, r.dtype, r.capacity, r.ops, side).dump(2) << "\n";
    c.close();
    if (!c) throw Error("export: writing " + (tmp.path() / kContractFile).string() + " failed");
  }
  tmp.commit(fs::path(out_dir));
  return r;
}

}  // namespace ingot::onnx_export
