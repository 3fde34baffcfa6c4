#include "export/onnx/linear_attention_graph.h"

#include <cmath>
#include <limits>

namespace ingot::onnx_export {

namespace {

Attr ai(const char* n, int64_t v) { return {n, v}; }
Attr ints(const char* n, std::vector<int64_t> v) { return {n, std::move(v)}; }

// [N, n*d] -> [B, S, n, d]
std::string split_heads(GraphBuilder& g, const LinearAttnContext& c, const std::string& x, int64_t n, int64_t d) {
  const std::string shape = g.op("Concat", {c.ids_shape, g.const_i64({n, d}, "heads")}, {ai("axis", 0)});
  return g.op("Reshape", {x, shape}, {}, "heads4");
}

// x * 1/sqrt(sum(x^2) + 1e-6) over the last axis: the delta rule's L2 norm of q and k, as the CPU
// reference forms it (ReduceSum takes its axes as an input from opset 13 on, below both targets).
std::string l2norm(GraphBuilder& g, const std::string& x, const std::string& hint) {
  const std::string ss = g.op("ReduceSum", {g.op("Mul", {x, x}), g.const_i64({-1}, "axes")}, {ai("keepdims", 1)}, hint + "_ss");
  const std::string inv =
      g.op("Reciprocal", {g.op("Sqrt", {g.op("Add", {ss, g.scalar_f32(1e-6f, "l2_eps")})})}, {}, hint + "_inv");
  return g.op("Mul", {x, inv}, {}, hint + "_l2");
}

// The delta rule's Scan body: one token of every row and value head.
//   state [B, HV, DK, DV], q_t/k_t [B, HV, DK], v_t [B, HV, DV], beta_t/decay_t [B, HV]
//   S = decay * S;  u = beta * (v - S^T k);  S += k u^T;  o = S^T q
// -> (state', o_t [B, HV, DV]).
Subgraph delta_rule_body(GraphBuilder& g, const ModelSpec& s, int64_t layer) {
  const LinearAttnSpec& l = s.linear;
  const std::string p = "delta_rule_" + std::to_string(layer);
  g.begin_subgraph(p);
  const std::string batch = "batch";
  const std::string st = p + "_state", q = p + "_q", k = p + "_k", v = p + "_v", beta = p + "_beta", decay = p + "_decay";
  g.input(st, OnnxType::Float, {batch, l.v_heads, l.k_dim, l.v_dim});
  g.input(q, OnnxType::Float, {batch, l.v_heads, l.k_dim});
  g.input(k, OnnxType::Float, {batch, l.v_heads, l.k_dim});
  g.input(v, OnnxType::Float, {batch, l.v_heads, l.v_dim});
  g.input(beta, OnnxType::Float, {batch, l.v_heads});
  g.input(decay, OnnxType::Float, {batch, l.v_heads});
  const std::string ax2 = g.const_i64({2}, "axes"), ax3 = g.const_i64({3}, "axes"), ax23 = g.const_i64({2, 3}, "axes");
  const std::string s1 = g.op("Mul", {st, g.op("Unsqueeze", {decay, ax23})}, {}, "decayed");  // [B,HV,DK,DV]
  const std::string k_row = g.op("Unsqueeze", {k, ax2}, {}, "k_row");                         // [B,HV,1,DK]
  const std::string ks = g.op("MatMul", {k_row, s1}, {}, "kS");                               // [B,HV,1,DV]
  const std::string u = g.op("Mul", {g.op("Unsqueeze", {beta, ax23}), g.op("Sub", {g.op("Unsqueeze", {v, ax2}), ks})},
                             {}, "delta");                                                    // [B,HV,1,DV]
  const std::string s2 = g.op("Add", {s1, g.op("Mul", {g.op("Unsqueeze", {k, ax3}), u})}, {}, "state");  // [B,HV,DK,DV]
  const std::string o = g.op("MatMul", {g.op("Unsqueeze", {q, ax2}, {}, "q_row"), s2}, {}, "o");          // [B,HV,1,DV]
  const std::string state_out = p + "_state_out", o_out = p + "_o";
  g.node_named("Identity", {s2}, {state_out});
  g.node_named("Squeeze", {o, ax2}, {o_out});
  g.output(state_out, OnnxType::Float, {batch, l.v_heads, l.k_dim, l.v_dim});
  g.output(o_out, OnnxType::Float, {batch, l.v_heads, l.v_dim});
  return g.end_subgraph();
}

}  // namespace

std::string linear_attention(GraphBuilder& g, const ModelSpec& s, const LinearAttnWeights& w,
                             const LinearAttnContext& c, const std::string& proj, int64_t layer) {
  const LinearAttnSpec& l = s.linear;
  const int64_t C = l.conv_channels(), KW = l.key_width(), V = l.value_width(), H = l.v_heads, K = l.conv_kernel;
  auto parts = g.node("Split", {proj, g.const_i64({C, V, H, H}, "split")}, 4, {ai("axis", 1)}, "lin_part");
  const std::string& qkv = parts[0];  // [N, C]
  const std::string& z = parts[1];    // [N, V]

  // --- causal conv1d + SiLU. The conv state holds the inputs at slots w - (K-1) .. w - 1; slots below 0
  // read as zeros (the runtime's rule), so a row at write index 0 ignores whatever its state holds.
  const std::string wi_col = g.op("Unsqueeze", {c.write_indices, g.const_i64({1}, "axes")}, {}, "wi_col");  // [B,1]
  std::vector<int64_t> taps(size_t(K - 1));
  for (int64_t i = 0; i < K - 1; ++i) taps[size_t(i)] = i;
  const std::string hist_slot = g.op("Add", {wi_col, g.const_i64(taps, "hist_tap")}, {}, "hist_slot");  // [B,K-1] = slot + K-1
  const std::string hist_ok = g.op("Unsqueeze", {g.op("Greater", {hist_slot, g.scalar_i64(K - 2, "k_minus_2")}),
                                                 g.const_i64({1}, "axes")},
                                   {}, "hist_valid");  // [B,1,K-1]
  const std::string zero = g.scalar_f32(0.0f, "zero_f");
  const std::string hist = g.op("Where", {hist_ok, c.past_conv, zero}, {}, "conv_hist");  // [B,C,K-1]
  const std::string x3 = g.op("Reshape", {qkv, g.op("Concat", {c.ids_shape, g.const_i64({C}, "c")}, {ai("axis", 0)})},
                              {}, "conv_in");  // [B,S,C]
  const std::string xt = g.op("Transpose", {x3}, {ints("perm", {0, 2, 1})}, "conv_in_t");  // [B,C,S]
  const std::string full = g.op("Concat", {hist, xt}, {ai("axis", 2)}, "conv_window");   // [B,C,K-1+S]
  // present conv state: the last K-1 inputs of the window (older history when S < K-1).
  g.node_named("Slice", {full, g.const_i64({-(K - 1)}, "starts"), g.const_i64({std::numeric_limits<int64_t>::max()}, "ends"),
                         g.const_i64({2}, "axes")},
               {c.present_conv});
  const std::string wk = g.op("Reshape", {w.conv, g.const_i64({C, 1, K}, "conv_w3")}, {}, "conv_w");  // [C,1,K]
  const std::string conv =
      g.op("Conv", {full, wk}, {ai("group", C), ints("kernel_shape", {K})}, "conv");  // [B,C,S], depthwise, no padding
  const std::string act = g.op("Mul", {conv, g.op("Sigmoid", {conv})}, {}, "conv_silu");
  const std::string act_t = g.op("Transpose", {act}, {ints("perm", {0, 2, 1})}, "conv_out");  // [B,S,C]
  auto qkv_parts = g.node("Split", {act_t, g.const_i64({KW, KW, V}, "split")}, 3, {ai("axis", -1)}, "conv_part");

  // --- the delta rule's per-token inputs, computed for the whole chunk before the Scan.
  const std::string shape_k = g.op("Concat", {c.ids_shape, g.const_i64({l.k_heads, l.k_dim}, "kh")}, {ai("axis", 0)});
  std::string q = g.op("Reshape", {qkv_parts[0], shape_k}, {}, "lin_q");  // [B,S,HK,DK]
  std::string k = g.op("Reshape", {qkv_parts[1], shape_k}, {}, "lin_k");
  const std::string v =
      g.op("Reshape", {qkv_parts[2], g.op("Concat", {c.ids_shape, g.const_i64({H, l.v_dim}, "vh")}, {ai("axis", 0)})},
           {}, "lin_v");  // [B,S,HV,DV]
  q = g.op("Mul", {l2norm(g, q, "lin_q"), g.scalar_f32(1.0f / std::sqrt(float(l.k_dim)), "q_scale")}, {}, "lin_q_scaled");
  k = l2norm(g, k, "lin_k");
  const int64_t group = H / l.k_heads;
  if (group > 1) {  // value head h reads key head h / group: [B,S,HK,DK] -> [B,S,HK,group,DK] -> [B,S,HV,DK]
    auto repeat = [&](const std::string& x) {
      const std::string u = g.op("Unsqueeze", {x, g.const_i64({3}, "axes")});
      const std::string e = g.op("Expand", {u, g.const_i64({1, 1, 1, group, 1}, "group")});
      return g.op("Reshape", {e, g.const_i64({0, 0, H, l.k_dim}, "rep")}, {}, "kh_repeat");
    };
    q = repeat(q);
    k = repeat(k);
  }
  const std::string bh_shape = g.op("Concat", {c.ids_shape, g.const_i64({H}, "h")}, {ai("axis", 0)});
  const std::string beta = g.op("Reshape", {g.op("Sigmoid", {parts[2]}), bh_shape}, {}, "beta");  // [B,S,HV]
  // decay = exp(-exp(A_log) * softplus(a + dt_bias)); softplus as torch's (threshold 20: x itself above).
  const std::string a = g.op("Add", {parts[3], w.dt_bias}, {}, "a_dt");  // [N,HV]
  const std::string sp = g.op("Where", {g.op("Greater", {a, g.scalar_f32(20.0f, "sp_threshold")}), a, g.op("Softplus", {a})},
                              {}, "softplus");
  const std::string neg_a = g.op("Neg", {g.op("Exp", {w.a_log})}, {}, "neg_A");
  const std::string decay = g.op("Reshape", {g.op("Exp", {g.op("Mul", {neg_a, sp})}), bh_shape}, {}, "decay");  // [B,S,HV]

  // --- the delta rule: a Scan over the chunk's tokens (sequence-major inputs), the recurrent state its
  // carry. A row at write index 0 starts from zeros (its stale state is never read, NaN or not).
  const std::string w4 = g.op("Unsqueeze", {c.write_indices, g.const_i64({1, 2, 3}, "axes")}, {}, "wi4");  // [B,1,1,1]
  const std::string state0 =
      g.op("Where", {g.op("Greater", {w4, g.scalar_i64(0, "zero")}), c.past_recurrent, zero}, {}, "state0");
  auto seq_major = [&](const std::string& x, bool four) {
    return g.op("Transpose", {x}, {ints("perm", four ? std::vector<int64_t>{1, 0, 2, 3} : std::vector<int64_t>{1, 0, 2})},
                "seq_major");
  };
  const Subgraph body = delta_rule_body(g, s, layer);
  const std::string o_seq = g.fresh_name("delta_out");  // [S,B,HV,DV]
  g.node_named("Scan",
               {state0, seq_major(q, true), seq_major(k, true), seq_major(v, true), seq_major(beta, false),
                seq_major(decay, false)},
               {c.present_recurrent, o_seq}, {ai("num_scan_inputs", 5), Attr{"body", body}});
  const std::string o = g.op("Transpose", {o_seq}, {ints("perm", {1, 0, 2, 3})}, "delta_out_b");  // [B,S,HV,DV]

  // --- gated RMSNorm per value head: w * (o * 1/sqrt(mean(o^2) + eps)) * silu(z).
  const std::string sq = g.op("Mul", {o, o}, {}, "gnorm_sq");
  const std::string ms = g.opset() >= 18
                             ? g.op("ReduceMean", {sq, g.const_i64({-1}, "axes")}, {ai("keepdims", 1)}, "mean")
                             : g.op("ReduceMean", {sq}, {ints("axes", {-1}), ai("keepdims", 1)}, "mean");
  const std::string inv = g.op("Reciprocal", {g.op("Sqrt", {g.op("Add", {ms, c.eps})})}, {}, "gnorm_inv");
  const std::string z4 = split_heads(g, c, z, H, l.v_dim);
  const std::string gated = g.op("Mul", {g.op("Mul", {w.norm, g.op("Mul", {o, inv})}), g.op("Mul", {z4, g.op("Sigmoid", {z4})})},
                                 {}, "gnorm");  // [B,S,HV,DV]
  return g.op("Reshape", {gated, g.const_i64({-1, V}, "lin2d")}, {}, "lin_attn_out");  // [N, V]
}

}  // namespace ingot::onnx_export
