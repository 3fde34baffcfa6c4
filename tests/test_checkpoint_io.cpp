// Checkpoint reading: every malformed-input class of safetensors, sharded indexes, config.json and the
// name table gives an Error naming the file, tensor or field.
#include <gtest/gtest.h>

#include <filesystem>
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
  expect_error([&] { Checkpoint c(d.str()); }, {"s2.safetensors", "cannot open"});
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

TEST(Config, GenerationConfigEosAsIntOrList) {
  EXPECT_EQ(load_model_spec(test::fixture("llama3")).eos_ids.size(), 1u);
  EXPECT_EQ(load_model_spec(test::fixture("qwen2")).eos_ids.size(), 2u);
}

}  // namespace
}  // namespace ingot
