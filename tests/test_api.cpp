// The public API (include/ingot/ingot.h) on a fixture model given a tiny byte-level tokenizer: a
// checkpoint folder and the engine file built from it generate the same tokens as the runtime, stream
// them token by token, give the runtime's logits, and carry the tokenizer and chat template along.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ingot/ingot.h"
#include "io/engine_file.h"
#include "runtime/generator.h"
#include "test_helpers.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE (split as Qwen and Llama 3 do, then bytes mapped to characters the GPT-2 way) whose
// ids are the byte values, no merges, and
// three special tokens, sized to the fixtures' 512-token vocabulary.
void write_tokenizer(const fs::path& dir) {
  std::vector<uint32_t> printable;
  for (uint32_t b = '!'; b <= '~'; ++b) printable.push_back(b);
  for (uint32_t b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
  for (uint32_t b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
  nlohmann::json vocab = nlohmann::json::object();
  uint32_t extra = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool direct = std::find(printable.begin(), printable.end(), b) != printable.end();
    vocab[utf8(direct ? b : 256 + extra++)] = b;
  }
  // Fill up to the model's 512 ids (generation_config.json names eos 511), specials last.
  for (uint32_t id = 256; id < 509; ++id) vocab[utf8(0x400 + id)] = id;
  nlohmann::json added = nlohmann::json::array();
  const char* specials[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", 509 + i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  nlohmann::json tj = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+|[^\\w\\s]+|\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  nlohmann::json cfg = {{"eos_token", "<|im_end|>"},
                        {"chat_template",
                         "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}};
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
}

struct Fx {
  test::TempDir dir;
  std::string folder, engine;
  Fx() {
    folder = dir.file("qwen3");
    fs::copy(test::fixture("qwen3"), folder);
    write_tokenizer(folder);
    engine = dir.file("qwen3.ingot");
    EngineBuildInfo info;
    info.bounds.capacity = 64;
    info.source = describe_checkpoint(folder);
    save_engine(build_engine(folder), info, engine);
  }
};

api::LoadConfig cpu() {
  api::LoadConfig c;
  c.device = "cpu";
  c.capacity = 64;
  return c;
}

TEST(Api, TokenizerAndChatTemplateComeWithTheFolderAndTheEngineFile) {
  Fx f;
  api::Model a = api::Model::load(f.folder, cpu());
  api::Model b = api::Model::load(f.engine, cpu());
  EXPECT_EQ(a.tokenize("hi!", false), (std::vector<int32_t>{'h', 'i', '!'}));
  EXPECT_EQ(b.tokenize("hi!", false), a.tokenize("hi!", false));
  EXPECT_EQ(b.detokenize({'o', 'k'}), "ok");
  const std::vector<api::Message> chat = {{"user", "hello"}};
  EXPECT_EQ(a.render_chat(chat), "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(b.render_chat(chat), a.render_chat(chat));
  EXPECT_EQ(a.capacity(), 64);
  EXPECT_EQ(b.capacity(), 64);
  EXPECT_EQ(b.vocab_size(), 512);
  EXPECT_EQ(b.device(), "cpu");
}

TEST(Api, GenerationMatchesTheRuntimeAndStreamsTokenByToken) {
  Fx f;
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 7};
  Engine eng = build_engine(f.folder);
  auto be = make_cpu_backend();
  RuntimeOptions rt;
  rt.capacity = 64;
  Model m(eng, *be, rt);
  Request q;
  q.prompt = prompt;
  q.max_new_tokens = 10;
  const std::vector<int32_t> want = Generator(m).generate(std::move(q)).ids;

  for (const std::string& path : {f.folder, f.engine}) {
    api::Model am = api::Model::load(path, cpu());
    api::GenerateConfig c;
    c.max_new_tokens = 10;
    c.ignore_eos = true;
    std::vector<int32_t> streamed;
    std::string text;
    api::Result r = am.generate(prompt, c, [&](int32_t id, std::string_view t) {
      if (id >= 0) streamed.push_back(id);
      text += t;
    });
    EXPECT_EQ(r.token_ids, want) << path;
    EXPECT_EQ(streamed, want) << path;
    EXPECT_EQ(text, r.text) << path;
    EXPECT_EQ(r.stop_reason, "length");
    EXPECT_EQ(r.prompt_tokens, 5);
  }
}

TEST(Api, LogitsAreTheRuntimeLogits) {
  Fx f;
  const std::vector<int32_t> ids = {3, 40, 77, 120, 5, 9};
  Engine eng = build_engine(f.folder);
  auto be = make_cpu_backend();
  RuntimeOptions rt;
  rt.capacity = 64;
  Model m(eng, *be, rt);
  HostTensor want = m.forward(Batch{{BatchRow{0, ids, 0, {}, true}}});
  for (const std::string& path : {f.folder, f.engine}) {
    api::Model am = api::Model::load(path, cpu());
    std::vector<float> got = am.logits(ids);
    ASSERT_EQ(got.size(), size_t(want.numel()));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0) << path;
  }
}

TEST(Api, ChatReusesTheCachedConversation) {
  Fx f;
  api::Model am = api::Model::load(f.engine, cpu());
  api::GenerateConfig c;
  c.max_new_tokens = 2;
  c.ignore_eos = true;
  std::vector<api::Message> msgs = {{"user", "hi"}};
  api::Result first = am.chat(msgs, c);
  EXPECT_EQ(first.computed_prompt_tokens, first.prompt_tokens);
  msgs.push_back({"assistant", first.text});
  msgs.push_back({"user", "ok"});
  api::Result second = am.chat(msgs, c);
  EXPECT_GT(second.prompt_tokens, first.prompt_tokens);
  EXPECT_LT(second.computed_prompt_tokens, second.prompt_tokens);
}

// Qwen3.5's template (like Qwen3's) renders an earlier assistant turn otherwise than it was generated
// (here: without the "<think>\n" its generation prompt opened), so the re-rendered conversation does
// not extend what the row holds. A hybrid model cannot rewind its linear-attention state, so the next
// turn continues from the held tokens: only the new turn is prefilled, and the tokens equal a fresh
// run over the same sequence.
TEST(Api, AHybridModelsChatPrefillsOnlyTheNewTurnWhenTheTemplateRewritesHistory) {
  test::TempDir dir;
  const std::string folder = dir.file("qwen3_5");
  fs::copy(test::fixture("qwen3_5_text"), folder);
  write_tokenizer(folder);
  const nlohmann::json cfg = {
      {"eos_token", "<|im_end|>"},
      {"chat_template",
       "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"}};
  std::ofstream(fs::path(folder) / "tokenizer_config.json") << cfg.dump();
  api::LoadConfig lc = cpu();
  lc.capacity = 256;  // the fixture tokenizer spends a token per byte
  api::Model am = api::Model::load(folder, lc);
  api::GenerateConfig c;
  c.max_new_tokens = 3;
  c.ignore_eos = true;
  std::vector<api::Message> msgs = {{"user", "hi"}};
  api::Result first = am.chat(msgs, c);
  ASSERT_EQ(first.token_ids.size(), 3u);
  msgs.push_back({"assistant", first.text});
  msgs.push_back({"user", "ok"});
  // What the row holds, then the new turn (the reply was cut by the length limit: its end marker first).
  std::vector<int32_t> want = am.tokenize(am.render_chat({{"user", "hi"}}), false);
  EXPECT_EQ(int64_t(want.size()), first.prompt_tokens);
  want.insert(want.end(), first.token_ids.begin(), first.token_ids.end());
  for (int32_t t : am.tokenize("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n<think>\n", false))
    want.push_back(t);
  const std::vector<int32_t> rerendered = am.tokenize(am.render_chat(msgs), false);
  ASSERT_FALSE(std::equal(want.begin(), want.begin() + first.prompt_tokens + 3, rerendered.begin()));
  api::Result second = am.chat(msgs, c);
  EXPECT_EQ(second.prompt_tokens, int64_t(want.size()));
  EXPECT_EQ(second.computed_prompt_tokens, int64_t(want.size()) - (first.prompt_tokens + 2));
  api::Model fresh = api::Model::load(folder, lc);
  EXPECT_EQ(second.token_ids, fresh.generate(want, c).token_ids);
  // An edited history is not a continuation: the rendered conversation is prefilled whole.
  msgs[0].content = "hey";
  api::Result edited = am.chat(msgs, c);
  EXPECT_EQ(edited.computed_prompt_tokens, edited.prompt_tokens);
  EXPECT_EQ(edited.prompt_tokens, int64_t(am.tokenize(am.render_chat(msgs), false).size()));
}

TEST(Api, ErrorsNameTheProblem) {
  Fx f;
  test::expect_error([&] { api::Model::load(f.dir.file("missing.ingot"), cpu()); }, {"missing.ingot"});
  api::LoadConfig c = cpu();
  c.capacity = 32;  // within the engine's bound: the cache is sized for the request, not the bound
  EXPECT_EQ(api::Model::load(f.engine, c).capacity(), 32);
  c.capacity = 0;  // min(4096, max_position 64, the bound 64)
  EXPECT_EQ(api::Model::load(f.engine, c).capacity(), 64);
  c.capacity = 65;
  test::expect_error([&] { api::Model::load(f.engine, c); }, {"needs capacity 65", "built for at most 64"});
  api::Model am = api::Model::load(f.engine, cpu());
  api::GenerateConfig g;
  g.max_new_tokens = 100;
  test::expect_error([&] { am.generate(std::vector<int32_t>{1, 2, 3}, g); }, {"capacity is 64"});
  // A model without tokenizer files can still give logits, but not text.
  api::Model bare = api::Model::load(test::fixture("qwen3"), cpu());
  EXPECT_EQ(bare.logits({1, 2}).size(), 2u * 512u);
  test::expect_error([&] { bare.tokenize("x"); }, {"no tokenizer"});
}

TEST(Api, ChatTemplateFileReplacesTheModelsAndIsCheckedAtLoad) {
  Fx f;
  const std::string file = f.dir.file("plain.jinja");
  std::ofstream(file) << "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:";
  api::LoadConfig c = cpu();
  c.chat_template_file = file;
  for (const std::string& path : {f.folder, f.engine}) {
    api::Model am = api::Model::load(path, c);
    EXPECT_EQ(am.render_chat({{"user", "hello"}}), "user: hello\nassistant:") << path;
  }
  c.chat_template_file = f.dir.file("missing.jinja");
  test::expect_error([&] { api::Model::load(f.folder, c); }, {"missing.jinja", "does not exist"});
  c.chat_template_file = f.dir.str();
  test::expect_error([&] { api::Model::load(f.folder, c); }, {f.dir.str(), "directory"});
  const std::string broken = f.dir.file("broken.jinja");
  std::ofstream(broken) << "{% for m in messages %}\n{{ m.content }\n{% endfor %}";
  c.chat_template_file = broken;
  test::expect_error([&] { api::Model::load(f.engine, c); }, {"broken.jinja", "line 2"});
}

TEST(Api, AChatIsRefusedAtLoadWithoutATemplate) {
  Fx f;
  // The folder without a chat template: tokenizer_config.json loses its template.
  std::ofstream(fs::path(f.folder) / "tokenizer_config.json") << R"({"eos_token": "<|im_end|>"})";
  api::LoadConfig c = cpu();
  c.chat = true;
  test::expect_error([&] { api::Model::load(f.folder, c); }, {f.folder, "no chat template", "--chat-template FILE"});
  c.chat = false;  // generation without a chat still loads; a chat then fails the same way
  api::Model am = api::Model::load(f.folder, c);
  test::expect_error([&] { am.chat({{"user", "hi"}}); }, {"no chat template", "--chat-template FILE"});
  c.chat = true;
  test::expect_error([&] { api::Model::load(test::fixture("qwen3"), c); }, {"no tokenizer"});
}

TEST(Api, FitCapacityStopsWhereTheCacheEnds) {
  Fx f;
  api::Model am = api::Model::load(f.engine, cpu());  // 64 slots
  api::GenerateConfig g;
  g.max_new_tokens = 100;
  g.ignore_eos = true;
  g.fit_capacity = true;
  const std::vector<int32_t> prompt(60, 7);
  api::Result r = am.generate(prompt, g);
  EXPECT_EQ(r.token_ids.size(), 5u);  // slots 60..63 hold four of them; the fifth is never fed back
  EXPECT_EQ(r.stop_reason, "capacity");
  g.max_new_tokens = 5;  // fits exactly: an ordinary stop
  EXPECT_EQ(am.generate(prompt, g).stop_reason, "length");
  api::Result none = am.generate(std::vector<int32_t>(65, 7), g);  // no room at all: nothing runs
  EXPECT_TRUE(none.token_ids.empty());
  EXPECT_EQ(none.stop_reason, "capacity");
  EXPECT_EQ(none.computed_prompt_tokens, 0);
  g.fit_capacity = false;
  test::expect_error([&] { am.generate(std::vector<int32_t>(65, 7), g); }, {"capacity is 64"});
}

TEST(Api, ARequestPastMaxPositionEmbeddingsWarnsFirst) {
  Fx f;  // the fixture's max_position_embeddings is 64; a larger cache lets the request run
  api::LoadConfig c = cpu();
  c.capacity = 80;
  api::Model am = api::Model::load(f.folder, c);
  api::GenerateConfig g;
  g.ignore_eos = true;
  std::vector<std::string> warnings;
  bool generated = false;
  g.on_warning = [&](const std::string& w) {
    EXPECT_FALSE(generated);  // before any token
    warnings.push_back(w);
  };
  g.max_new_tokens = 3;
  am.generate(std::vector<int32_t>(62, 7), g, [&](int32_t, std::string_view) { generated = true; });
  EXPECT_TRUE(warnings.empty());  // 64 positions
  g.max_new_tokens = 4;
  generated = false;
  am.generate(std::vector<int32_t>(62, 7), g, [&](int32_t, std::string_view) { generated = true; });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("max_position_embeddings (64)"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("65 positions"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace ingot
