// config.json parsing. Field names and defaults follow transformers' config classes: the fields every
// family shares are read here, then the family's configure hook reads its own (models/<family>.cpp);
// every missing or mistyped required field is an error naming the file and field.
#include "io/model_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "models/config_fields.h"
#include "models/family.h"

namespace ingot {
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Upper bounds of config.json's sizes. Each is far above every published dense model (the largest,
// Llama 3.1 405B, has 126 layers, 128 heads, hidden 16384, intermediate 53248; head_dim reaches 256
// and vocabularies 262144 elsewhere; contexts reach 10M positions) and far below what overflows the
// int32 token ids, positions and per-row offsets the kernels use. A value beyond one is a corrupt or
// mistyped config, refused before anything is sized by it.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHidden = 65536;
constexpr int64_t kMaxIntermediate = 262144;
constexpr int64_t kMaxHeadDim = 1024;
// The sample op sums 2^40-scaled weights over the vocabulary in 64 bits: it needs vocab < 2^24.
constexpr int64_t kMaxVocab = int64_t(1) << 22;
constexpr int64_t kMaxPositions = int64_t(1) << 26;
// The whole model: 2^40 parameters (2 TB in 16-bit) is past any host or card; the separate bounds
// above still allow products that large, so the total is checked on its own.
constexpr double kMaxParameters = double(int64_t(1) << 40);

std::vector<int64_t> token_ids(const json& v, const std::string& where) {
  std::vector<int64_t> out;
  if (v.is_null()) return out;
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (!v.is_array()) throw Error(where + " must be an integer or a list of integers");
  for (const json& e : v) {
    if (!e.is_number_integer()) throw Error(where + " must be an integer or a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// Reads rope settings from either form into spec.rope.
void parse_rope(const json& cfg, const std::string& src, ModelSpec& spec) {
  ConfigFields f{cfg, src};
  RopeSpec& r = spec.rope;
  json params = json::object();
  std::string block;
  if (f.has("rope_parameters")) {
    block = "rope_parameters";
    params = cfg["rope_parameters"];
  } else if (f.has("rope_scaling")) {
    block = "rope_scaling";
    params = cfg["rope_scaling"];
  }
  if (!params.is_object()) throw Error(src + ": field '" + block + "' must be an object");
  ConfigFields p{params, src + " (" + block + ")"};
  // rope_theta lives in rope_parameters (new form) or at the top level (classic form).
  r.theta = p.has("rope_theta") ? p.number_or("rope_theta", 10000.0) : f.number_or("rope_theta", 10000.0);
  r.partial_rotary_factor = p.has("partial_rotary_factor") ? p.number_or("partial_rotary_factor", 1.0)
                                                           : f.number_or("partial_rotary_factor", 1.0);
  std::string type = "default";
  if (params.contains("rope_type") && params["rope_type"].is_string()) type = params["rope_type"];
  else if (params.contains("type") && params["type"].is_string()) type = params["type"];  // older spelling
  r.type = type;
  auto need = [&](const std::string& k) {
    if (!p.has(k)) throw Error(p.where(k) + " is required for rope_type '" + type + "'");
    return p.number_or(k, 0.0);
  };
  auto positions = [&](double v) {
    if (!(v >= 1 && v <= double(kMaxPositions)))
      throw Error(p.where("original_max_position_embeddings") + " must be in [1, " + std::to_string(kMaxPositions) +
                  "], got " + std::to_string(v));
    return int64_t(v);
  };
  if (type == "default") {
  } else if (type == "linear") {
    r.factor = need("factor");
  } else if (type == "llama3") {
    r.factor = need("factor");
    r.low_freq_factor = need("low_freq_factor");
    r.high_freq_factor = need("high_freq_factor");
    r.original_max_position = positions(need("original_max_position_embeddings"));
  } else if (type == "yarn") {
    r.factor = need("factor");
    r.original_max_position = positions(p.number_or("original_max_position_embeddings", double(spec.max_position)));
    if (p.has("attention_factor")) r.attention_factor = p.number_or("attention_factor", 1.0);
    if (p.has("mscale")) r.mscale = p.number_or("mscale", 0.0);
    if (p.has("mscale_all_dim")) r.mscale_all_dim = p.number_or("mscale_all_dim", 0.0);
    if (p.has("beta_fast")) r.beta_fast = p.number_or("beta_fast", 32.0);
    if (p.has("beta_slow")) r.beta_slow = p.number_or("beta_slow", 1.0);
    r.truncate = p.bool_or("truncate", true);
  } else {
    throw Error(src + ": rope_type '" + type + "' is not supported (supported: default, linear, llama3, yarn)");
  }
  if (type == "llama3" && !(r.high_freq_factor > r.low_freq_factor))
    throw Error(src + ": rope high_freq_factor must be above low_freq_factor (the smoothing divides by their difference)");
  if (r.theta <= 0) throw Error(src + ": rope_theta must be positive");
  if (r.factor <= 0) throw Error(src + ": rope factor must be positive");
  if (r.partial_rotary_factor <= 0 || r.partial_rotary_factor > 1)
    throw Error(src + ": partial_rotary_factor must be in (0, 1]");
}

}  // namespace

namespace {

// The decoder's settings in `cfg` (config.json itself, or a wrapper's text_config) for `family`.
ModelSpec parse_decoder(const json& cfg, const std::string& src, const std::string& model_type, const Family& family) {
  ConfigFields f{cfg, src};
  ModelSpec s;
  s.family = model_type;
  s.vocab = f.positive_int("vocab_size", kMaxVocab);
  s.hidden = f.positive_int("hidden_size", kMaxHidden);
  s.intermediate = f.positive_int("intermediate_size", kMaxIntermediate);
  s.layers = f.positive_int("num_hidden_layers", kMaxLayers);
  s.heads = f.positive_int("num_attention_heads", kMaxHeads);
  s.kv_heads = f.positive_int_or("num_key_value_heads", s.heads, kMaxHeads);
  if (s.heads % s.kv_heads != 0)
    throw Error(src + ": num_attention_heads " + std::to_string(s.heads) + " is not a multiple of num_key_value_heads " +
                std::to_string(s.kv_heads));
  if (f.has("head_dim")) {
    s.head_dim = f.positive_int("head_dim", kMaxHeadDim);
  } else if (family.default_head_dim > 0) {
    s.head_dim = family.default_head_dim;
  } else {
    if (s.hidden % s.heads != 0) throw Error(src + ": head_dim is missing and hidden_size is not divisible by heads");
    s.head_dim = s.hidden / s.heads;
  }
  s.max_position = f.positive_int_or("max_position_embeddings", 2048, kMaxPositions);
  s.rms_eps = f.number_or("rms_norm_eps", 1e-6);
  if (!(s.rms_eps > 0))
    throw Error(f.where("rms_norm_eps") + " must be positive, got " + cfg["rms_norm_eps"].dump() +
                " (the norm divides by sqrt(mean(x^2) + eps))");
  // transformers maps both names to the same function (nn.SiLU); the MLP kernels compute only it.
  if (f.has("hidden_act")) {
    if (!cfg["hidden_act"].is_string()) throw Error(f.where("hidden_act") + " must be a string");
    const std::string act = cfg["hidden_act"];
    if (act != "silu" && act != "swish")
      throw Error(f.where("hidden_act") + " is '" + act + "', which is not supported (supported: silu, swish)");
  }
  s.tie_embeddings = f.bool_or("tie_word_embeddings", false);  // false in all three config classes
  if (f.has("torch_dtype") && cfg["torch_dtype"].is_string()) s.torch_dtype = cfg["torch_dtype"];
  if (f.has("dtype") && cfg["dtype"].is_string()) s.torch_dtype = cfg["dtype"];
  if (f.bool_or("mlp_bias", false)) throw Error(src + ": mlp_bias true is not supported");

  s.qkv_bias = s.o_bias = f.bool_or("attention_bias", false);  // a family may rule otherwise

  const double params = double(s.vocab) * double(s.hidden) * (s.tie_embeddings ? 1 : 2) +
                        double(s.layers) * (double(s.hidden) * double(s.q_dim() + 2 * s.kv_dim() + s.q_dim()) +
                                            3.0 * double(s.hidden) * double(s.intermediate));
  if (params > kMaxParameters)
    throw Error(src + ": the sizes describe a model of " + std::to_string(int64_t(params / 1e9)) +
                " billion parameters, above the limit of " + std::to_string(int64_t(kMaxParameters / 1e9)) +
                " billion (vocab_size " + std::to_string(s.vocab) + ", hidden_size " + std::to_string(s.hidden) +
                ", intermediate_size " + std::to_string(s.intermediate) + ", num_hidden_layers " +
                std::to_string(s.layers) + ")");

  parse_rope(cfg, src, s);
  if (s.rope_dim() % 2 != 0 || s.rope_dim() > s.head_dim) throw Error(src + ": rotary dimension must be even and <= head_dim");

  s.window.assign(size_t(s.layers), 0);  // full attention unless the family reads sliding windows
  family.configure(f, s);

  s.eos_ids = token_ids(cfg.value("eos_token_id", json()), src + ": field 'eos_token_id'");
  auto bos = token_ids(cfg.value("bos_token_id", json()), src + ": field 'bos_token_id'");
  if (!bos.empty()) s.bos_id = bos[0];
  return s;
}

}  // namespace

ModelSpec parse_model_config(const json& cfg, const std::string& src) {
  if (!cfg.is_object()) throw Error(src + ": not a JSON object");
  ConfigFields f{cfg, src};
  if (!f.has("model_type") || !cfg["model_type"].is_string()) throw Error(f.where("model_type") + " is missing");
  const std::string model_type = cfg["model_type"];
  const Family& family = find_family(model_type, src);
  if (!family.text_config) return parse_decoder(cfg, src, model_type, family);
  // A wrapper: the decoder's settings are in text_config; the top level's token ids, tying and dtype
  // apply where text_config has none, and may not contradict it.
  const std::string key = family.text_config;
  if (!f.has(key) || !cfg[key].is_object())
    throw Error(f.where(key) + " must be an object with the text model's settings (model_type '" + model_type + "')");
  json inner = cfg[key];
  for (const char* k : {"tie_word_embeddings", "eos_token_id", "bos_token_id", "torch_dtype", "dtype"}) {
    if (!f.has(k)) continue;
    if (!inner.contains(k) || inner[k].is_null()) inner[k] = cfg[k];
    else if (std::string(k) == "tie_word_embeddings" && inner[k] != cfg[k])
      throw Error(src + ": tie_word_embeddings is " + cfg[k].dump() + " at the top level but " + inner[k].dump() +
                  " in " + key + "; the checkpoint cannot be both");
  }
  return parse_decoder(inner, src + " (" + key + ")", model_type, family);
}

namespace {
json read_json_file(const fs::path& p) {
  const std::string text = read_file(p.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not valid JSON: " + e.what());
  }
}
}  // namespace

ModelSpec load_config_file(const std::string& path) { return parse_model_config(read_json_file(path), path); }

ModelSpec load_model_spec(const std::string& dir) {
  const auto read = read_json_file;
  fs::path cfg = fs::path(dir) / "config.json";
  if (!fs::exists(cfg)) throw Error(dir + ": no config.json in the checkpoint folder");
  ModelSpec s = parse_model_config(read(cfg), cfg.string());
  fs::path gen = fs::path(dir) / "generation_config.json";
  if (fs::exists(gen)) {
    json g = read(gen);
    if (!g.is_object()) throw Error(gen.string() + ": not a JSON object");
    if (g.contains("eos_token_id") && !g["eos_token_id"].is_null())
      s.eos_ids = token_ids(g["eos_token_id"], gen.string() + ": field 'eos_token_id'");
    if (g.contains("bos_token_id") && !g["bos_token_id"].is_null()) {
      auto b = token_ids(g["bos_token_id"], gen.string() + ": field 'bos_token_id'");
      if (!b.empty()) s.bos_id = b[0];
    }
  }
  return s;
}

json spec_to_json(const ModelSpec& s) {
  json r = {{"type", s.rope.type}, {"theta", s.rope.theta}, {"factor", s.rope.factor},
            {"partial_rotary_factor", s.rope.partial_rotary_factor}, {"low_freq_factor", s.rope.low_freq_factor},
            {"high_freq_factor", s.rope.high_freq_factor}, {"original_max_position", s.rope.original_max_position},
            {"beta_fast", s.rope.beta_fast}, {"beta_slow", s.rope.beta_slow}, {"truncate", s.rope.truncate}};
  if (s.rope.attention_factor) r["attention_factor"] = *s.rope.attention_factor;
  if (s.rope.mscale) r["mscale"] = *s.rope.mscale;
  if (s.rope.mscale_all_dim) r["mscale_all_dim"] = *s.rope.mscale_all_dim;
  json j = {{"family", s.family}, {"vocab", s.vocab}, {"hidden", s.hidden}, {"intermediate", s.intermediate},
            {"layers", s.layers}, {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim},
            {"max_position", s.max_position}, {"rms_eps", s.rms_eps}, {"tie_embeddings", s.tie_embeddings},
            {"qkv_bias", s.qkv_bias}, {"o_bias", s.o_bias}, {"qk_norm", s.qk_norm}, {"window", s.window},
            {"rope", r}, {"eos_ids", s.eos_ids}, {"torch_dtype", s.torch_dtype}};
  if (s.bos_id) j["bos_id"] = *s.bos_id;
  // Hybrid and gated-attention models only, so dense engine files stay as they were.
  if (s.attn_gate) j["attn_gate"] = true;
  if (!s.kinds.empty()) {
    json kinds = json::array();
    for (LayerKind k : s.kinds) kinds.push_back(k == LayerKind::Linear ? "linear_attention" : "full_attention");
    j["layer_kinds"] = kinds;
    const LinearAttnSpec& l = s.linear;
    j["linear"] = {{"k_heads", l.k_heads}, {"v_heads", l.v_heads}, {"k_dim", l.k_dim}, {"v_dim", l.v_dim},
                   {"conv_kernel", l.conv_kernel}};
  }
  return j;
}

ModelSpec spec_from_json(const json& j) {
  try {
    ModelSpec s;
    s.family = j.at("family");
    s.vocab = j.at("vocab");
    s.hidden = j.at("hidden");
    s.intermediate = j.at("intermediate");
    s.layers = j.at("layers");
    s.heads = j.at("heads");
    s.kv_heads = j.at("kv_heads");
    s.head_dim = j.at("head_dim");
    s.max_position = j.at("max_position");
    s.rms_eps = j.at("rms_eps");
    s.tie_embeddings = j.at("tie_embeddings");
    s.qkv_bias = j.at("qkv_bias");
    s.o_bias = j.at("o_bias");
    s.qk_norm = j.at("qk_norm");
    s.window = j.at("window").get<std::vector<int64_t>>();
    s.eos_ids = j.at("eos_ids").get<std::vector<int64_t>>();
    s.torch_dtype = j.value("torch_dtype", "");
    if (j.contains("bos_id")) s.bos_id = j["bos_id"].get<int64_t>();
    s.attn_gate = j.value("attn_gate", false);
    if (j.contains("layer_kinds")) {
      for (const json& k : j.at("layer_kinds")) {
        const std::string name = k.get<std::string>();
        if (name != "linear_attention" && name != "full_attention")
          throw Error("model metadata is malformed: layer kind '" + name + "' is unknown");
        s.kinds.push_back(name == "linear_attention" ? LayerKind::Linear : LayerKind::Attention);
      }
      if (int64_t(s.kinds.size()) != s.layers) throw Error("model metadata is malformed: layer_kinds length differs from layer count");
      const json& l = j.at("linear");
      s.linear = {l.at("k_heads"), l.at("v_heads"), l.at("k_dim"), l.at("v_dim"), l.at("conv_kernel")};
      check_linear_spec(s, "model metadata");
    }
    if ((s.attn_gate || !s.kinds.empty()) && !find_family(s.family, "model metadata").hybrid)
      throw Error("model metadata is malformed: layer kinds or an attention gate for family '" + s.family +
                  "', whose layers have neither");
    const json& r = j.at("rope");
    s.rope.type = r.at("type");
    s.rope.theta = r.at("theta");
    s.rope.factor = r.at("factor");
    s.rope.partial_rotary_factor = r.at("partial_rotary_factor");
    s.rope.low_freq_factor = r.at("low_freq_factor");
    s.rope.high_freq_factor = r.at("high_freq_factor");
    s.rope.original_max_position = r.at("original_max_position");
    s.rope.beta_fast = r.at("beta_fast");
    s.rope.beta_slow = r.at("beta_slow");
    s.rope.truncate = r.at("truncate");
    if (r.contains("attention_factor")) s.rope.attention_factor = r["attention_factor"].get<double>();
    if (r.contains("mscale")) s.rope.mscale = r["mscale"].get<double>();
    if (r.contains("mscale_all_dim")) s.rope.mscale_all_dim = r["mscale_all_dim"].get<double>();
    if (int64_t(s.window.size()) != s.layers) throw Error("window list length differs from layer count");
    return s;
  } catch (const json::exception& e) {
    throw Error(std::string("model metadata is malformed: ") + e.what());
  }
}

}  // namespace ingot
