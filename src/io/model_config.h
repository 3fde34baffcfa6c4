// ModelSpec: everything the runtime needs from a checkpoint's config.json and generation_config.json,
// normalised across families and across transformers' two config forms (classic rope_theta/rope_scaling
// and the rope_parameters block that transformers 5 writes).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

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
  std::string family;  // model_type: llama | qwen2 | qwen3
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

// Parses config.json content; `source` names the file in errors.
ModelSpec parse_model_config(const nlohmann::json& config, const std::string& source);
// Reads one config.json-style file (e.g. a shapes file for benchmarks with random weights).
ModelSpec load_config_file(const std::string& path);
// Reads DIR/config.json and, if present, DIR/generation_config.json (its eos/bos win over config.json's).
ModelSpec load_model_spec(const std::string& dir);
// Serialises the spec (for engine metadata and `inspect`).
nlohmann::json spec_to_json(const ModelSpec& spec);
ModelSpec spec_from_json(const nlohmann::json& j);

// RoPE inverse frequencies [rope_dim/2] and the cos/sin scale, computed in f32 the way transformers does.
std::vector<float> rope_inv_freq(const ModelSpec& spec);
float rope_attention_scale(const ModelSpec& spec);

}  // namespace ingot
