// Shared building blocks of a decoder layer. Weight declarations (the parts of the Hugging Face name
// table every family shares) and the forward helpers (norm, qkv + RoPE + cache write, attention, mlp)
// that family files wire together. They call backend ops only.
#pragma once
#include <string>

#include "backend/backend.h"
#include "models/config_fields.h"
#include "models/family.h"

namespace ingot {

// One weight in backend memory, in the engine's runtime layout.
struct DevWeight {
  Mat m;  // rows x cols (vectors are 1 x n)
  const void* data() const { return m.data; }
};

// A layer's weights after the layout transform; optional ones are null.
struct LayerWeights {
  const DevWeight* attn_norm = nullptr;  // [hidden]
  const DevWeight* wqkv = nullptr;       // [(q_heads + 2*kv_heads) * head_dim, hidden]
  const DevWeight* bqkv = nullptr;       // [(q_heads + 2*kv_heads) * head_dim] or null
  const DevWeight* q_norm = nullptr;     // [head_dim] or null
  const DevWeight* k_norm = nullptr;     // [head_dim] or null
  const DevWeight* wo = nullptr;         // [hidden, q_heads * head_dim]
  const DevWeight* bo = nullptr;         // [hidden] or null
  const DevWeight* mlp_norm = nullptr;   // [hidden]
  const DevWeight* w_gate_up = nullptr;  // [2 * intermediate, hidden]: gate rows then up rows
  const DevWeight* w_down = nullptr;     // [hidden, intermediate]
};

// Activations of one forward call, all [T, ...] token-major in backend memory, plus what the helpers
// need to address the cache. Sized once for the largest call; T is this call's token count.
struct ForwardContext {
  Backend& be;
  const ModelSpec& spec;
  int64_t T = 0;
  Mat x;      // [T, hidden] residual stream
  Mat h;      // [T, hidden] normalised input of the current block
  Mat delta;  // [T, hidden] output of the last block, added to x by the next add_rmsnorm
  Mat qkv;    // [T, (q_heads + 2*kv_heads) * head_dim]
  Mat attn;   // [T, q_heads * head_dim]
  Mat gate_up;  // [T, 2 * intermediate]
  Mat act;      // [T, intermediate]
  bool pending_delta = false;  // delta holds a block output not yet added to x
  TokenMeta meta;
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float rope_scale = 1.0f;
  int max_kv_len = 0;
  int rows = 0;  // distinct cache rows in the call
  KvLayerView (*cache_view)(void* owner, int layer) = nullptr;
  void* cache_owner = nullptr;
};

// Weight declarations shared by the Llama-style families.
void declare_embeddings(WeightTable& t, const ModelSpec& s);
void declare_attention(WeightTable& t, const ModelSpec& s, int layer);  // norm, q/k/v/o (+ biases per spec)
void declare_qk_norm(WeightTable& t, const ModelSpec& s, int layer);
void declare_mlp(WeightTable& t, const ModelSpec& s, int layer);
void declare_output(WeightTable& t, const ModelSpec& s);  // final norm and lm_head unless tied
// The whole table of a Llama-style checkpoint; `extra` adds a family's own per-layer tensors.
WeightTable llama_style_weights(const ModelSpec& s, void (*extra)(WeightTable&, const ModelSpec&, int) = nullptr);

// Qwen's sliding windows (Qwen2, Qwen3): explicit layer_types win; otherwise, with use_sliding_window,
// layers from max_window_layers on use sliding_window.
void qwen_sliding_windows(const ConfigFields& config, ModelSpec& spec);

// Forward helpers.
void attention_block(ForwardContext& c, const LayerWeights& w, int layer);  // x += attn(norm(x)) (deferred add)
void mlp_block(ForwardContext& c, const LayerWeights& w);                    // x += mlp(norm(x)) (deferred add)
// attention_block then mlp_block: the pre-norm decoder layer all current families share.
void prenorm_decoder_layer(ForwardContext& c, const LayerWeights& w, int layer);

}  // namespace ingot
