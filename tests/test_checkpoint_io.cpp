// Checkpoint reading: every malformed-input class of safetensors, sharded indexes, config.json and the
// name table gives an Error naming the file, tensor or field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/engine.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/rope.h"
#include "test_helpers.h"

namespace ingot {
namespace {
using json = nlohmann::json;
using test::expect_error;
using test::st_bytes;
using test::TempDir;
using test::write_bytes;

const std::string kOk = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(Safetensors, ReadsAValidFile) {
  TempDir d;
  write_bytes(d.file("x.safetensors"), st_bytes(kOk, std::string(8, '\0')));
  SafetensorsFile f(d.file("x.safetensors"));
  ASSERT_NE(f.find("a"), nullptr);
  EXPECT_EQ(f.find("a")->shape, (Shape{2}));
}

TEST(Safetensors, RoundTripsThroughTheWriter) {
  TempDir d;
  HostTensor t(DType::BF16, {3, 5});
  for (int i = 0; i < 15; ++i) t.as<uint16_t>()[i] = uint16_t(i * 77);
  write_safetensors(d.file("w.safetensors"), {{"w", t.view()}}, {{"k", "v"}});
  SafetensorsFile f(d.file("w.safetensors"));
  ASSERT_NE(f.find("w"), nullptr);
  EXPECT_EQ(f.find("w")->dtype, DType::BF16);
  EXPECT_EQ(std::memcmp(f.find("w")->data, t.data(), t.nbytes()), 0);
  EXPECT_EQ(f.metadata().at("k"), "v");
}

struct BadCase {
  const char* name;
  std::string bytes;
  std::vector<std::string> fragments;
};

TEST(Safetensors, RejectsEveryMalformedClass) {
  const std::string data8(8, '\0');
  std::vector<BadCase> cases = {
      {"short", "abc", {"too short"}},
      {"huge_header", st_bytes(kOk, data8, uint64_t(1) << 40), {"exceeds the limit"}},
      {"header_past_eof", st_bytes(kOk, data8, kOk.size() + 100), {"runs past the end"}},
      {"bad_json", st_bytes("{not json", data8), {"not valid JSON"}},
      {"not_object", st_bytes("[1,2]", data8), {"not a JSON object"}},
      {"bad_dtype", st_bytes(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data8), {"'a'", "unsupported dtype"}},
      {"no_dtype", st_bytes(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", data8), {"'a'", "dtype"}},
      {"neg_shape", st_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8), {"'a'", "shape"}},
      {"bad_offsets", st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", data8), {"'a'", "data_offsets"}},
      {"begin_after_end", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data8), {"'a'", "begin"}},
      {"outside", st_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8), {"'a'", "outside the data block"}},
      {"length_mismatch", st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8), {"'a'", "does not match"}},
      {"overlap",
       st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                data8),
       {"overlap"}},
      {"metadata_not_strings", st_bytes(R"({"__metadata__":{"x":1}})", ""), {"__metadata__"}},
  };
  TempDir d;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = d.file(std::string(c.name) + ".safetensors");
    write_bytes(path, c.bytes);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;  // names the file
      for (const std::string& frag : c.fragments) EXPECT_NE(msg.find(frag), std::string::npos) << msg;
    }
  }
}

TEST(Checkpoint, ErrorsNameTheFolderIndexAndShard) {
  TempDir d;
  expect_error([&] { Checkpoint c(d.file("nope")); }, {"nope", "not a checkpoint folder"});
  expect_error([&] { Checkpoint c(d.str()); }, {"no model.safetensors"});
  write_bytes(d.file("model.safetensors.index.json"), "{oops");
  expect_error([&] { Checkpoint c(d.str()); }, {"model.safetensors.index.json", "not valid JSON"});
  write_bytes(d.file("model.safetensors.index.json"), R"({"metadata":{}})");
  expect_error([&] { Checkpoint c(d.str()); }, {"weight_map"});
  write_bytes(d.file("model.safetensors.index.json"), R"({"weight_map":{"a":"../x.safetensors"}})");
  expect_error([&] { Checkpoint c(d.str()); }, {"plain file name"});
  write_bytes(d.file("s1.safetensors"), st_bytes(kOk, std::string(8, '\0')));
  write_bytes(d.file("model.safetensors.index.json"), R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  expect_error([&] { Checkpoint c(d.str()); }, {"'b'", "s1.safetensors", "does not contain"});
  write_bytes(d.file("model.safetensors.index.json"), R"({"weight_map":{"a":"s2.safetensors"}})");
  expect_error([&] { Checkpoint c(d.str()); }, {"s2.safetensors", "does not exist"});
  write_bytes(d.file("model.safetensors.index.json"), R"({"weight_map":{"a":"s1.safetensors"}})");
  Checkpoint ok(d.str());
  expect_error([&] { ok.get("zzz"); }, {"'zzz'", "missing"});
}

// Copies a fixture and lets the test damage one tensor of it.
void rewrite_fixture_tensor(const std::string& src_dir, const std::string& dst_dir, const std::string& drop,
                            const std::string& reshape_name = "") {
  std::filesystem::copy(src_dir + "/config.json", dst_dir + "/config.json");
  Checkpoint ck(src_dir);
  std::map<std::string, TensorView> keep;
  for (const std::string& n : ck.names()) {
    if (n == drop) continue;
    TensorView v = ck.get(n).view();
    if (n == reshape_name) v.shape = {v.numel()};
    keep[n] = v;
  }
  write_safetensors(dst_dir + "/model.safetensors", keep);
}

TEST(BuildEngine, MissingTensorIsNamed) {
  TempDir d;
  rewrite_fixture_tensor(test::fixture("llama3"), d.str(), "model.layers.1.mlp.up_proj.weight");
  expect_error([&] { build_engine(d.str()); }, {"model.layers.1.mlp.up_proj.weight", "missing"});
}

TEST(BuildEngine, WrongShapeIsNamed) {
  TempDir d;
  rewrite_fixture_tensor(test::fixture("llama3"), d.str(), "", "model.layers.0.self_attn.k_proj.weight");
  expect_error([&] { build_engine(d.str()); }, {"model.layers.0.self_attn.k_proj.weight", "has shape", "expected [32, 64]"});
}

// Copies a fixture's config (edited by `config`) and tensors (edited by `tensors`) into dst_dir.
void edited_fixture(const std::string& src_dir, const std::string& dst_dir, const std::function<void(json&)>& config,
                    const std::function<void(std::map<std::string, HostTensor>&)>& tensors) {
  json c = json::parse(std::ifstream(src_dir + "/config.json"));
  config(c);
  std::ofstream(dst_dir + "/config.json") << c.dump();
  Checkpoint ck(src_dir);
  std::map<std::string, HostTensor> owned;
  for (const std::string& n : ck.names()) {
    const TensorEntry& e = ck.get(n);
    HostTensor t(e.dtype, e.shape);
    std::memcpy(t.data(), e.data, e.nbytes);
    owned.emplace(n, std::move(t));
  }
  tensors(owned);
  std::map<std::string, TensorView> views;
  for (auto& [n, t] : owned) views[n] = t.view();
  write_safetensors(dst_dir + "/model.safetensors", views);
}
void keep_config(json&) {}
void keep_tensors(std::map<std::string, HostTensor>&) {}

TEST(BuildEngine, TensorsBeyondTheConfigAreRefusedAndListed) {
  // A config saying 1 layer over the 2-layer checkpoint: layer 1's tensors are unused.
  TempDir d;
  edited_fixture(test::fixture("qwen3"), d.str(), [](json& c) {
    c["num_hidden_layers"] = 1;
    c["layer_types"] = {"full_attention"};
  }, keep_tensors);
  expect_error([&] { build_engine(d.str()); },
               {"config.json and the checkpoint disagree", "model.layers.1.input_layernorm.weight", "more",
                "layers up to model.layers.1", "num_hidden_layers is 1"});
}

TEST(BuildEngine, TensorsTheConfigTurnsOffAreRefused) {
  // A bias the config does not declare would be silently dropped: the model would compute without it.
  TempDir d;
  edited_fixture(test::fixture("llama3"), d.str(), keep_config, [](std::map<std::string, HostTensor>& t) {
    t.emplace("model.layers.0.self_attn.q_proj.bias", HostTensor(DType::F32, {64}));
  });
  expect_error([&] { build_engine(d.str()); }, {"disagree", "model.layers.0.self_attn.q_proj.bias"});
}

TEST(BuildEngine, HarmlessExtrasAreWarningsOnly) {
  TempDir d;
  // qwen2 ties the output layer to the embedding.
  edited_fixture(test::fixture("qwen2"), d.str(), keep_config, [](std::map<std::string, HostTensor>& t) {
    t.emplace("model.layers.0.self_attn.rotary_emb.inv_freq", HostTensor(DType::F32, {8}));
    t.emplace("model.layers.1.self_attn.rotary_emb.inv_freq", HostTensor(DType::F32, {8}));
    const HostTensor& emb = t.at("model.embed_tokens.weight");
    HostTensor copy(emb.dtype(), emb.shape());
    std::memcpy(copy.data(), emb.data(), emb.nbytes());
    t.emplace("lm_head.weight", std::move(copy));
  });
  std::vector<std::string> warnings;
  BuildOptions o;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  const Engine ok = build_engine(d.str(), o);
  EXPECT_FALSE(ok.find("lm_head"));  // the embedding is the output layer
  ASSERT_EQ(warnings.size(), 1u);    // an lm_head identical to the embedding is not worth a word
  EXPECT_NE(warnings[0].find("2 tensor(s) named '*rotary_emb.inv_freq' are ignored"), std::string::npos) << warnings[0];

  TempDir d2;
  edited_fixture(test::fixture("qwen2"), d2.str(), keep_config, [](std::map<std::string, HostTensor>& t) {
    t.emplace("lm_head.weight", HostTensor(DType::F32, t.at("model.embed_tokens.weight").shape()));
  });
  warnings.clear();
  build_engine(d2.str(), o);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("'lm_head.weight' differs from the embedding"), std::string::npos) << warnings[0];
}

TEST(BuildEngine, NonFiniteWeightsAreRefusedWithTheirIndex) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    TempDir d;
    edited_fixture(test::fixture("llama3"), d.str(), keep_config, [&](std::map<std::string, HostTensor>& t) {
      t.at("model.layers.1.self_attn.k_proj.weight").as<float>()[3 * 64 + 5] = bad;  // [32, 64]
    });
    SCOPED_TRACE(bad);
    // Fused into wqkv, converted or copied as is: the checkpoint's name and index are what is reported.
    for (DType dt : {DType::F32, DType::BF16}) {
      BuildOptions o;
      o.dtype = dt;
      expect_error([&] { build_engine(d.str(), o); },
                   {"'model.layers.1.self_attn.k_proj.weight'", "non-finite", "[3, 5]", "damaged"});
    }
  }
}

TEST(BuildEngine, WeightsOverflowingTheEngineDtypeAreRefused) {
  TempDir d;
  edited_fixture(test::fixture("llama3"), d.str(), keep_config, [](std::map<std::string, HostTensor>& t) {
    t.at("model.norm.weight").as<float>()[7] = 1e6f;  // beyond f16's 65504
  });
  BuildOptions o;
  o.dtype = DType::F16;
  expect_error([&] { build_engine(d.str(), o); }, {"'model.norm.weight'", "[7]", "overflows f16", "--dtype"});
  o.dtype = DType::BF16;
  EXPECT_NO_THROW(build_engine(d.str(), o));
}

TEST(BuildEngine, ShardedAndSingleFileAgree) {
  // qwen3 is sharded over three files; the others are single files.
  Engine e = build_engine(test::fixture("qwen3"));
  EXPECT_EQ(e.spec.family, "qwen3");
  EXPECT_TRUE(e.find("layers.0.q_norm"));
  EXPECT_EQ(e.get("layers.0.wqkv").shape(), (Shape{e.spec.q_dim() + 2 * e.spec.kv_dim(), e.spec.hidden}));
}

json base_config() {
  return json{{"model_type", "llama"}, {"vocab_size", 100}, {"hidden_size", 32}, {"intermediate_size", 64},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
}

TEST(Config, DefaultsFollowTransformers) {
  ModelSpec s = parse_model_config(base_config(), "config.json");
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_FALSE(s.tie_embeddings);
  EXPECT_EQ(s.rope.type, "default");
  json q3 = base_config();
  q3["model_type"] = "qwen3";
  EXPECT_EQ(parse_model_config(q3, "c").head_dim, 128);  // Qwen3Config's own default
  EXPECT_TRUE(parse_model_config(q3, "c").qk_norm);
  json q2 = base_config();
  q2["model_type"] = "qwen2";
  EXPECT_TRUE(parse_model_config(q2, "c").qkv_bias);
  EXPECT_FALSE(parse_model_config(q2, "c").o_bias);
}

TEST(Config, BothRopeFormsMeanTheSame) {
  json classic = base_config(), modern = base_config();
  classic["rope_theta"] = 500000.0;
  classic["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  modern["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  ModelSpec a = parse_model_config(classic, "a"), b = parse_model_config(modern, "b");
  EXPECT_EQ(rope_inv_freq(a), rope_inv_freq(b));
  EXPECT_EQ(a.rope.type, "llama3");
}

TEST(Config, SlidingWindowRules) {
  json c = base_config();
  c["model_type"] = "qwen2";
  c["num_hidden_layers"] = 3;
  c["use_sliding_window"] = true;
  c["sliding_window"] = 7;
  c["max_window_layers"] = 1;
  EXPECT_EQ(parse_model_config(c, "c").window, (std::vector<int64_t>{0, 7, 7}));
  c["max_window_layers"] = 0;
  EXPECT_EQ(parse_model_config(c, "c").window, (std::vector<int64_t>{7, 7, 7}));
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(parse_model_config(c, "c").window, (std::vector<int64_t>{0, 7, 0}));
  c["use_sliding_window"] = false;  // Qwen2.5 configs carry sliding_window even when it is off
  EXPECT_EQ(parse_model_config(c, "c").window, (std::vector<int64_t>{0, 0, 0}));
}

TEST(Config, ErrorsNameTheField) {
  auto bad = [](json c, std::initializer_list<std::string> frags) {
    expect_error([&] { parse_model_config(c, "cfg.json"); }, frags);
  };
  json c = base_config();
  c.erase("hidden_size");
  bad(c, {"cfg.json", "'hidden_size'", "missing"});
  c = base_config();
  c["vocab_size"] = "many";
  bad(c, {"'vocab_size'", "integer"});
  c = base_config();
  c["model_type"] = "gpt2";
  bad(c, {"'gpt2'", "not supported"});
  c = base_config();
  c["num_key_value_heads"] = 3;
  bad(c, {"not a multiple"});
  c = base_config();
  c["rope_scaling"] = {{"rope_type", "longrope"}};
  bad(c, {"'longrope'", "not supported"});
  c = base_config();
  c["rope_scaling"] = {{"rope_type", "yarn"}};
  bad(c, {"'factor'", "yarn"});
  c = base_config();
  c["model_type"] = "qwen3";
  c["layer_types"] = {"full_attention"};
  bad(c, {"layer_types"});
  c = base_config();
  c["eos_token_id"] = "x";
  bad(c, {"eos_token_id"});
}

TEST(Config, AbsurdSizesAreRefusedWithTheLimit) {
  auto bad = [](const std::string& field, json value, std::initializer_list<std::string> frags) {
    json c = base_config();
    c[field] = value;
    SCOPED_TRACE(field);
    expect_error([&] { parse_model_config(c, "cfg.json"); }, frags);
  };
  bad("num_hidden_layers", 100000000, {"'num_hidden_layers'", "100000000", "limit of 1024"});
  bad("vocab_size", int64_t(1000000000000), {"'vocab_size'", "1000000000000", "limit of 4194304"});
  bad("hidden_size", 1 << 20, {"'hidden_size'", "limit of 65536"});
  bad("intermediate_size", 1 << 30, {"'intermediate_size'", "limit of 262144"});
  bad("num_attention_heads", 4096, {"'num_attention_heads'", "limit of 1024"});
  bad("num_key_value_heads", 4096, {"'num_key_value_heads'", "limit of 1024"});
  bad("head_dim", 1 << 16, {"'head_dim'", "limit of 1024"});
  bad("max_position_embeddings", int64_t(1) << 40, {"'max_position_embeddings'", "limit of 67108864"});
  bad("num_hidden_layers", uint64_t(1) << 63, {"'num_hidden_layers'", "9223372036854775808", "limit"});
  json c = base_config();
  c["model_type"] = "qwen2";
  c["use_sliding_window"] = true;
  c["sliding_window"] = 4;
  c["max_window_layers"] = uint64_t(1) << 63;
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"'max_window_layers'", "non-negative integer"});
  // Each size within its bound, all of them at once beyond any machine.
  c = base_config();
  c["num_hidden_layers"] = 1024;
  c["hidden_size"] = 65536;
  c["intermediate_size"] = 262144;
  c["num_attention_heads"] = 512;
  c["num_key_value_heads"] = 512;
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"billion parameters", "above the limit of 1099 billion"});
}

TEST(Config, ActivationAndNormEpsMustBeWhatRuns) {
  json c = base_config();
  c["hidden_act"] = "gelu";
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"'hidden_act'", "'gelu'", "not supported", "silu"});
  c["hidden_act"] = 3;
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"'hidden_act'", "string"});
  for (const char* same : {"silu", "swish"}) {  // one function in transformers
    c["hidden_act"] = same;
    EXPECT_NO_THROW(parse_model_config(c, "cfg.json"));
  }
  for (double eps : {0.0, -1.0}) {
    json e = base_config();
    e["rms_norm_eps"] = eps;
    expect_error([&] { parse_model_config(e, "cfg.json"); }, {"'rms_norm_eps'", "must be positive"});
  }
}

TEST(Config, NonFiniteNumbersAreRefused) {
  // JSON text has no NaN or infinity (and 1e999 fails to parse), but a config built in code can.
  for (const char* field : {"rope_theta", "rms_norm_eps", "partial_rotary_factor"}) {
    for (double v : {double(NAN), double(INFINITY)}) {
      json c = base_config();
      c[field] = v;
      SCOPED_TRACE(field);
      expect_error([&] { parse_model_config(c, "cfg.json"); }, {field, "must be a finite number"});
    }
  }
  json c = base_config();
  c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -INFINITY}};
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"'factor'", "must be a finite number"});
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 1e30}};
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"'original_max_position_embeddings'", "must be in [1, "});
  c["rope_scaling"]["original_max_position_embeddings"] = 64;
  c["rope_scaling"]["high_freq_factor"] = 1.0;
  expect_error([&] { parse_model_config(c, "cfg.json"); }, {"high_freq_factor must be above low_freq_factor"});
}

TEST(Config, GenerationConfigEosAsIntOrList) {
  EXPECT_EQ(load_model_spec(test::fixture("llama3")).eos_ids.size(), 1u);
  EXPECT_EQ(load_model_spec(test::fixture("qwen2")).eos_ids.size(), 2u);
}

}  // namespace
}  // namespace ingot
