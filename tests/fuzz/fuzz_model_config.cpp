// libFuzzer target for config.json parsing (parse_model_config) and what is derived from a spec it
// accepts (RoPE frequencies and scale, the family's weight table, the spec's JSON round trip). Three
// input shapes, chosen by the first byte:
//   0: the rest is config text, as is;
//   1: a valid Qwen3 config with one field replaced: the next byte picks the field, the rest is its
//      new value (JSON, else a string), so the fuzzer spends its time in the field checks;
//   2: the same over a valid Qwen3.5 wrapper config, the field picked inside its text_config (layer
//      kinds, linear-attention sizes, partial rotary).
// Any exception other than ingot::Error, any crash or sanitizer report is a bug.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/model_config.h"
#include "models/family.h"
#include "models/rope.h"

namespace {

using nlohmann::json;

const json& base_config() {
  static const json j = json::parse(R"({
    "model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": false,
    "rope_theta": 10000.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1,
    "layer_types": ["full_attention", "sliding_attention"], "attention_bias": false,
    "eos_token_id": [1, 2], "bos_token_id": 0, "torch_dtype": "bfloat16"})");
  return j;
}

const json& hybrid_config() {
  static const json j = json::parse(R"({
    "model_type": "qwen3_5", "tie_word_embeddings": true, "dtype": "bfloat16",
    "text_config": {"model_type": "qwen3_5_text", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
      "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attn_output_gate": true,
      "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
      "full_attention_interval": 2, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8,
      "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
      "eos_token_id": 2}})");
  return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 2), size - 2);
  json cfg;
  if (data[0] % 3 == 0) {
    cfg = json::parse(std::string(reinterpret_cast<const char*>(data + 1), size - 1), nullptr, false);
    if (cfg.is_discarded()) return 0;
  } else {
    cfg = data[0] % 3 == 1 ? base_config() : hybrid_config();
    json& target = data[0] % 3 == 1 ? cfg : cfg["text_config"];
    auto it = target.begin();
    std::advance(it, data[1] % target.size());
    json v = json::parse(rest, nullptr, false);
    *it = v.is_discarded() ? json(rest) : v;
  }
  try {
    const ingot::ModelSpec s = ingot::parse_model_config(cfg, "config.json");
    (void)ingot::rope_inv_freq(s);
    (void)ingot::rope_attention_scale(s);
    (void)ingot::weight_table(s);
    (void)ingot::spec_from_json(ingot::spec_to_json(s));
  } catch (const ingot::Error&) {
  }
  return 0;
}
