// ModelSpec: everything the runtime needs to know about a model's architecture, normalised across
// families and across transformers' two config forms (classic rope_theta/rope_scaling and the
// rope_parameters block that transformers 5 writes). io/model_config.h reads it from config.json (each
// family adding its own defaults and fields, models/family.h); engine files store it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ingot {

struct RopeSpec {
  std::string type = "default";  // default | linear | llama3 | yarn
  double theta = 10000.0;
  double factor = 1.0;
  double partial_rotary_factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 0;  // llama3 and yarn
  // yarn
  std::optional<double> attention_factor;
  std::optional<double> mscale, mscale_all_dim;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
};

// A decoder layer's token mixer: softmax attention over the KV cache, or linear attention (Gated
// DeltaNet: a causal conv1d and a recurrent state per cache row, models/qwen3_5.cpp).
enum class LayerKind : uint8_t { Attention, Linear };

// The linear-attention layers' sizes (Qwen3.5 / Qwen3-Next: linear_num_key_heads, ...).
struct LinearAttnSpec {
  int64_t k_heads = 0, v_heads = 0;  // each key head serves v_heads / k_heads value heads
  int64_t k_dim = 0, v_dim = 0;      // per head
  int64_t conv_kernel = 0;           // linear_conv_kernel_dim
  int64_t key_width() const { return k_heads * k_dim; }
  int64_t value_width() const { return v_heads * v_dim; }
  int64_t conv_channels() const { return 2 * key_width() + value_width(); }  // q | k | v
  int64_t in_width() const { return conv_channels() + value_width() + 2 * v_heads; }  // qkv | z | b | a
};

// Limits of the linear-attention sizes: what the kernels take (the recurrent CUDA kernel holds a
// key head of up to 256 values per thread group; the conv kernels 2 to 8 taps), far above the
// published models (Qwen3.5: 16 key heads of 128, 32-64 value heads of 128, kernel 4).
inline constexpr int64_t kMaxLinearHeads = 1024;
inline constexpr int64_t kMaxLinearKeyDim = 256;
inline constexpr int64_t kMaxLinearValueDim = 1024;
inline constexpr int64_t kMaxConvKernel = 8;

// One rank's slice of a tensor-parallel model (runtime/tp_split.h). Set only in the spec a rank's Model
// runs, whose heads, kv_heads, intermediate and linear heads are then that rank's share; never stored
// in an engine file.
struct TpSlice {
  int world = 1, rank = 0;
  int64_t vocab_rows = 0;  // LM-head rows per rank: the vocabulary padded up to a multiple of world, / world
};

struct ModelSpec {
  std::string family;  // model_type, one of the families in models/registry.cpp
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position = 0;
  double rms_eps = 1e-6;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // bias on q/k/v projections
  bool o_bias = false;    // bias on the output projection
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (Qwen3)
  std::vector<int64_t> window;  // [layers]: sliding-window size, 0 = full attention
  std::vector<LayerKind> kinds;  // [layers], or empty: every layer is an attention layer
  bool attn_gate = false;  // q_proj gives [query | gate] per head; the output is multiplied by sigmoid(gate)
  LinearAttnSpec linear;   // sizes of the linear layers (when any)
  RopeSpec rope;
  std::vector<int64_t> eos_ids;
  std::optional<int64_t> bos_id;
  TpSlice tp;              // world 1: the whole model
  std::string torch_dtype;  // as declared by the checkpoint ("float32", "bfloat16", ...), may be empty

  // Rows of the LM head this spec's Model holds: the vocabulary, or a tensor-parallel rank's share.
  int64_t lm_head_rows() const { return tp.world > 1 ? tp.vocab_rows : vocab; }
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  // Width of the fused q|k|v projection (plus the gates when attn_gate).
  int64_t qkv_width() const { return q_dim() * (attn_gate ? 2 : 1) + 2 * kv_dim(); }
  LayerKind kind(int64_t layer) const { return kinds.empty() ? LayerKind::Attention : kinds[size_t(layer)]; }
  int64_t layers_of(LayerKind k) const {
    int64_t n = 0;
    for (int64_t l = 0; l < layers; ++l) n += kind(l) == k;
    return n;
  }
  bool has_linear_layers() const { return layers_of(LayerKind::Linear) > 0; }
  int64_t rope_dim() const { return int64_t(double(head_dim) * rope.partial_rotary_factor); }
};

// Error (prefixed by `where`) unless the linear-attention sizes are within the limits above, the value
// heads a multiple of the key heads, and one layer kind is given per layer.
void check_linear_spec(const ModelSpec& spec, const std::string& where);

}  // namespace ingot
