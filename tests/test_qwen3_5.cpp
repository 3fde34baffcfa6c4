// Qwen3.5 beyond the parity tests: its config errors, the checkpoint tensors it needs, the
// linear-attention state's rules (rows outside a call untouched, a row continues only from its end or
// restarts, a restart equals a fresh row) and a conversation continuing from the state, prefilling
// only its new tokens, with the tokens of a fresh run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/engine.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "test_helpers.h"

namespace ingot {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

json text_config() {
  std::ifstream f(test::fixture("qwen3_5_text") + "/config.json");
  return json::parse(f);
}

TEST(Qwen3_5Config, ReadsLayerKindsAndLinearSizes) {
  ModelSpec s = parse_model_config(text_config(), "config.json");
  ASSERT_EQ(s.kinds.size(), 4u);  // full_attention_interval 2: layers 1 and 3 are full attention
  EXPECT_EQ(s.kinds[0], LayerKind::Linear);
  EXPECT_EQ(s.kinds[1], LayerKind::Attention);
  EXPECT_EQ(s.kinds[3], LayerKind::Attention);
  EXPECT_TRUE(s.attn_gate);
  EXPECT_EQ(s.linear.conv_channels(), 2 * 2 * 16 + 4 * 16);
  EXPECT_EQ(s.rope_dim(), 8);  // partial_rotary_factor 0.5 of head_dim 16
  // The engine metadata round trip keeps all of it.
  ModelSpec back = spec_from_json(spec_to_json(s));
  EXPECT_EQ(back.kinds, s.kinds);
  EXPECT_EQ(back.linear.conv_channels(), s.linear.conv_channels());
  EXPECT_TRUE(back.attn_gate);
  // Engine metadata is input too: layer kinds on a dense family, a kind list of the wrong length, an
  // unknown kind or sizes the kernels cannot take are refused, never run.
  json j = spec_to_json(s);
  auto refuse = [&](const std::function<void(json&)>& edit, std::initializer_list<std::string> words) {
    json e = j;
    edit(e);
    test::expect_error([&] { spec_from_json(e); }, words);
  };
  refuse([](json& e) { e["family"] = "qwen3"; }, {"malformed", "qwen3"});
  refuse([](json& e) { e["layer_kinds"].erase(0); }, {"malformed", "layer_kinds"});
  refuse([](json& e) { e["layer_kinds"][1] = "mamba"; }, {"malformed", "mamba"});
  refuse([](json& e) { e["linear"]["conv_kernel"] = 1; }, {"linear_conv_kernel_dim"});
  refuse([](json& e) { e["linear"]["v_heads"] = 3; }, {"not a multiple"});
  refuse([](json& e) { e["linear"]["k_dim"] = "x"; }, {"malformed"});
}

TEST(Qwen3_5Config, BadValuesNameTheField) {
  auto refuse = [](const std::function<void(json&)>& edit, std::initializer_list<std::string> words) {
    json c = text_config();
    edit(c);
    test::expect_error([&] { parse_model_config(c, "cfg.json"); }, words);
  };
  refuse([](json& c) { c["layer_types"] = {"linear_attention", "full_attention"}; }, {"layer_types", "one entry per layer (4)"});
  refuse([](json& c) { c["layer_types"] = {"linear_attention", "full_attention", "sliding_attention", "full_attention"}; },
         {"layer_types", "entry 2", "sliding_attention"});
  refuse([](json& c) { c["linear_num_value_heads"] = 3; }, {"linear_num_value_heads 3", "not a multiple", "linear_num_key_heads 2"});
  refuse([](json& c) { c["linear_conv_kernel_dim"] = 9; }, {"linear_conv_kernel_dim", "9"});
  refuse([](json& c) { c["linear_key_head_dim"] = 512; }, {"linear_key_head_dim", "512"});
  refuse([](json& c) { c.erase("linear_num_key_heads"); }, {"linear_num_key_heads", "missing"});
  refuse([](json& c) { c["partial_rotary_factor"] = 0.05; c["rope_parameters"]["partial_rotary_factor"] = 0.05; },
         {"rotary"});
  // The wrapper: text_config must be there, and agree with the top level on tying.
  json w = {{"model_type", "qwen3_5"}};
  test::expect_error([&] { parse_model_config(w, "cfg.json"); }, {"text_config", "must be an object"});
  w["text_config"] = text_config();
  w["tie_word_embeddings"] = false;
  test::expect_error([&] { parse_model_config(w, "cfg.json"); }, {"tie_word_embeddings", "text_config"});
}

// A copy of a fixture with one tensor dropped from its weights.
std::string without_tensor(const test::TempDir& tmp, const std::string& fixture, const std::string& drop) {
  const std::string dir = tmp.file("m");
  fs::create_directories(dir);
  fs::copy_file(test::fixture(fixture) + "/config.json", dir + "/config.json");
  SafetensorsFile f(test::fixture(fixture) + "/model.safetensors");
  std::map<std::string, TensorView> keep;
  for (const auto& [n, t] : f.tensors())
    if (n != drop) keep.emplace(n, TensorView{t.dtype, t.shape, t.data});
  write_safetensors(dir + "/model.safetensors", keep, {{"format", "pt"}});
  return dir;
}

TEST(Qwen3_5Checkpoint, MissingLinearWeightsAreNamed) {
  for (const char* t : {"model.layers.1.linear_attn.A_log", "model.layers.2.linear_attn.dt_bias",
                        "model.layers.2.linear_attn.conv1d.weight"}) {
    test::TempDir tmp;
    const std::string dir = without_tensor(tmp, "qwen3_5_pattern", t);
    test::expect_error([&] { build_engine(dir); }, {t});
  }
}

struct Fx {
  Engine eng = build_engine(test::fixture("qwen3_5_pattern"));
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model(int rows, int64_t capacity = 64) {
    RuntimeOptions rt;
    rt.max_batch = rows;
    rt.capacity = capacity;
    return std::make_unique<Model>(eng, *be, rt);
  }
};

std::vector<int32_t> seq(int n, int32_t from) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((from + 37 * i) % 500 + 3);
  return v;
}

TEST(Qwen3_5State, RowsOutsideACallAreUntouchedAndRowsContinueOnlyFromTheirEnd) {
  Fx f;
  auto m = f.model(3);
  for (int r = 0; r < 3; ++r) m->forward(Batch{{BatchRow{r, seq(6, r), 0, {}, false}}});
  const std::vector<uint8_t> row0 = m->state().read_row(0), row2 = m->state().read_row(2);
  m->forward(Batch{{BatchRow{1, seq(2, 9), 6, {}, false}}});
  EXPECT_EQ(m->state().read_row(0), row0);
  EXPECT_EQ(m->state().read_row(2), row2);
  // Row 1 now holds 8 tokens: writing at 5 would compute from a state that has seen 8.
  test::expect_error([&] { m->forward(Batch{{BatchRow{1, seq(1, 4), 5, {}, false}}}); },
                     {"recurrent", "holds its first 8 tokens", "write index 8", "not at 5"});
  EXPECT_EQ(m->state().read_row(0), row0);
}

TEST(Qwen3_5State, ARestartAtSlotZeroEqualsAFreshRow) {
  Fx f;
  auto m = f.model(2);
  const std::vector<int32_t> a = seq(7, 11), b = seq(9, 5);
  m->forward(Batch{{BatchRow{0, a, 0, {}, false}}});
  HostTensor again = m->forward(Batch{{BatchRow{0, b, 0, {}, true}}});  // the row restarts with other tokens
  HostTensor fresh = m->forward(Batch{{BatchRow{1, b, 0, {}, true}}});
  ASSERT_EQ(again.nbytes(), fresh.nbytes());
  EXPECT_EQ(std::memcmp(again.data(), fresh.data(), again.nbytes()), 0);
}

TEST(Qwen3_5State, AConversationContinuesFromTheStateWithTheTokensOfAFreshRun) {
  Fx f;
  auto m = f.model(2);
  Generator g(*m);
  auto request = [](std::vector<int32_t> prompt, int n) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = n;
    return r;
  };
  Completion c1 = g.generate(request(seq(12, 3), 6));
  ASSERT_EQ(c1.ids.size(), 6u);
  std::vector<int32_t> next = seq(12, 3);
  next.insert(next.end(), c1.ids.begin(), c1.ids.end());
  for (int32_t t : seq(5, 77)) next.push_back(t);
  Completion c2 = g.generate(request(next, 8));
  EXPECT_EQ(c2.slot, c1.slot);
  EXPECT_EQ(c2.computed_prompt_tokens, int64_t(next.size()) - (12 + 6 - 1));  // only the new turn
  auto fresh_model = f.model(1);
  Generator fresh(*fresh_model);
  EXPECT_EQ(c2.ids, fresh.generate(request(next, 8)).ids);
  // A prompt that does not extend the cached sequence cannot rewind the state: the row restarts.
  std::vector<int32_t> branch(next.begin(), next.begin() + 10);
  branch.push_back(7);
  Completion c3 = g.generate(request(branch, 4));
  EXPECT_EQ(c3.computed_prompt_tokens, int64_t(branch.size()));
  auto fresh2 = f.model(1);
  EXPECT_EQ(c3.ids, Generator(*fresh2).generate(request(branch, 4)).ids);
}

// Eight requests at once (different prompt lengths: some prefill while others decode) give each the
// tokens it gives alone.
TEST(Qwen3_5State, GreedyTokensAloneEqualInsideABatchOf8) {
  Fx f;
  auto one = f.model(1), eight = f.model(8);
  std::vector<std::vector<int32_t>> alone;
  Generator g(*eight);
  std::vector<Completion> done(8);
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.prompt = seq(4 + 3 * i, 10 * i + 1);
    r.max_new_tokens = 12;
    Request copy;
    copy.prompt = r.prompt;
    copy.max_new_tokens = r.max_new_tokens;
    alone.push_back(Generator(*one).generate(std::move(copy)).ids);
    r.on_done = [&done, i](const Completion& c) { done[size_t(i)] = c; };
    g.submit(std::move(r));
  }
  g.run();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(done[size_t(i)].ids, alone[size_t(i)]) << "request " << i;
}

}  // namespace
}  // namespace ingot
