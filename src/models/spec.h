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
  RopeSpec rope;
  std::vector<int64_t> eos_ids;
  std::optional<int64_t> bos_id;
  std::string torch_dtype;  // as declared by the checkpoint ("float32", "bfloat16", ...), may be empty

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t rope_dim() const { return int64_t(double(head_dim) * rope.partial_rotary_factor); }
};

}  // namespace ingot
