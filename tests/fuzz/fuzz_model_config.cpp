// libFuzzer target for config.json parsing (parse_model_config) and what is derived from a spec it
// accepts (RoPE frequencies and scale, the spec's JSON round trip). Two input shapes, chosen by the
// first byte:
//   0: the rest is config text, as is;
//   1: a valid Qwen3 config with one field replaced: the next byte picks the field, the rest is its
//      new value (JSON, else a string), so the fuzzer spends its time in the field checks.
// Any exception other than ingot::Error, any crash or sanitizer report is a bug.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/model_config.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 2), size - 2);
  json cfg;
  if (data[0] % 2 == 0) {
    cfg = json::parse(std::string(reinterpret_cast<const char*>(data + 1), size - 1), nullptr, false);
    if (cfg.is_discarded()) return 0;
  } else {
    cfg = base_config();
    auto it = cfg.begin();
    std::advance(it, data[1] % cfg.size());
    json v = json::parse(rest, nullptr, false);
    *it = v.is_discarded() ? json(rest) : v;
  }
  try {
    const ingot::ModelSpec s = ingot::parse_model_config(cfg, "config.json");
    (void)ingot::rope_inv_freq(s);
    (void)ingot::rope_attention_scale(s);
    (void)ingot::spec_from_json(ingot::spec_to_json(s));
  } catch (const ingot::Error&) {
  }
  return 0;
}
