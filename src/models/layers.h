// Shared building blocks of the decoder families: the weight table of a Llama-style checkpoint, the
// config rule Qwen's families share, the layer helpers (norm, qkv + RoPE + cache write, attention,
// mlp) that family files wire together, and the stack around the layers: the embedding, the final
// norm and the LM head. They call backend ops only.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "models/config_fields.h"
#include "models/family.h"
#include "models/spec.h"
#include "models/state_layout.h"
#include "models/weights.h"

namespace ingot {

// Activations of one forward call, all [T, ...] token-major in backend memory, plus what the helpers
// need to address the state. Sized once for the largest call; T is this call's token count.
struct ForwardContext {
  Backend& be;
  const ModelSpec& spec;
  const StateView& state;  // each layer's K/V (runtime/state.h)
  int64_t T = 0;
  Mat x{};        // [T, hidden] residual stream
  Mat h{};        // [T, hidden] normalised input of the current block
  Mat delta{};    // [T, hidden] output of the last block, added to x by the next add_rmsnorm
  Mat qkv{};      // [T, (q_heads + 2*kv_heads) * head_dim]
  Mat attn{};     // [T, q_heads * head_dim]
  Mat gate_up{};  // [T, 2 * intermediate]
  Mat act{};      // [T, intermediate]
  // Linear-attention layers (views of the buffers above where their sizes allow):
  Mat lin_in{};    // [T, conv_channels + value_width + 2*v_heads]: qkv | z | b | a (in the qkv buffer)
  Mat lin_conv{};  // [T, conv_channels] conv1d + SiLU output: q | k | v
  Mat lin_out{};   // [T, value_width] delta rule output, then its gated norm (in the attn buffer)
  bool pending_delta = false;  // delta holds a block output not yet added to x
  TokenMeta meta{};
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float rope_scale = 1.0f;
  int max_kv_len = 0;
  int rows = 0;  // distinct cache rows in the call
  // Leading rows with one token each (the first single_rows tokens): a call that mixes decode rows with
  // prompt chunks runs attention in two parts, so that the chunks can take a many-tokens-per-row kernel
  // that the decode rows would otherwise rule out. Each token's attention reads only its own row, so the
  // split changes no result.
  int single_rows = 0;
  // Set on a rank of a tensor-parallel group (runtime/tp_split.h): the weights are this rank's slice,
  // and each block's row-parallel output projection leaves a partial sum in delta that one all-reduce
  // completes. Null: the whole model, no collective.
  Communicator* comm = nullptr;
};

// The runtime table of a Llama-style checkpoint, model-level weights first, then each layer's:
//   tok_embeddings [vocab, hidden]; final_norm [hidden]; lm_head [vocab, hidden] (absent when tied)
//   layers.{i}.attn_norm [hidden]; .wqkv = q|k|v_proj [(q_heads + 2*kv_heads)*head_dim, hidden];
//   .bqkv = their biases (qkv_bias); .q_norm/.k_norm [head_dim] (qk_norm); .wo [hidden, q_heads*head_dim];
//   .bo [hidden] (o_bias); .mlp_norm [hidden]; .w_gate_up = gate|up_proj [2*intermediate, hidden];
//   .w_down [hidden, intermediate]
WeightTable decoder_weights(const ModelSpec& spec);

// Qwen's sliding windows (Qwen2, Qwen3): explicit layer_types win; otherwise, with use_sliding_window,
// layers from max_window_layers on use sliding_window.
void qwen_sliding_windows(const ConfigFields& config, ModelSpec& spec);

// Layer helpers.
// x += attn(norm(x)) (deferred add); with spec.attn_gate the attention output is multiplied by
// sigmoid(gate) before the output projection, the gates being the last q_dim columns of wqkv's output.
void attention_block(ForwardContext& c, const LayerWeights& w, int layer);
// x += linear_attn(norm(x)) (deferred add): the Gated DeltaNet token mixer of Qwen3.5, in_proj ->
// causal conv1d + SiLU over q|k|v -> gated delta rule on the row's recurrent state -> gated RMSNorm
// with silu(z) -> out_proj.
void linear_attention_block(ForwardContext& c, const LayerWeights& w, int layer);
void mlp_block(ForwardContext& c, const LayerWeights& w);                    // x += mlp(norm(x)) (deferred add)
// attention_block then mlp_block: the pre-norm decoder layer all current families share.
void prenorm_decoder_layer(ForwardContext& c, const LayerWeights& w, int layer);

// The decoder over the call's tokens: x = embedding(ids [T]), the family's layers, then h = the final
// norm of x (the last block's pending output folded in first). h [T, hidden] is what the LM head reads.
void decoder_forward(ForwardContext& c, const Family& family, const ModelWeights& w, const int32_t* ids);
// logits [n, vocab] = h [n, hidden] · lm_head^T
void lm_head(Backend& be, const ModelWeights& w, const Mat& h, const Mat& logits);

}  // namespace ingot
