// Tokenizer tests: conformance with the Hugging Face `tokenizers` library on the committed corpus
// for the Qwen3, Llama 3 and Llama 2 tokenizer.json files (goldens made by
// tools/make_tokenizer_goldens.py), the streaming decoder, and errors on malformed files.
// The reference tokenizer files come from scripts/fetch-tokenizers (run by `make test`).
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <unistd.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using ingot::tok::StreamDecoder;
using ingot::tok::Tokenizer;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Fixtures and helpers

std::string tokenizers_root() {
  if (const char* c = std::getenv("INGOT_CACHE"); c && *c) return (fs::path(c) / "tokenizers").string();
  return (fs::path(INGOT_SOURCE_DIR) / ".cache" / "tokenizers").string();
}

std::string data_dir() { return (fs::path(INGOT_SOURCE_DIR) / "tests" / "data" / "tokenizer").string(); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// SHA-256, so a golden made from another corpus or tokenizer.json is reported as such rather than
// as a wall of id mismatches. Written here: the text library links no crypto code.
std::string sha256_hex(const std::string& data) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string msg = data;
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  for (size_t off = 0; off < msg.size(); off += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + off + 4 * i);
      w[i] = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
  char out[65];
  for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h[i]);
  return std::string(out, 64);
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string show_ids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

struct CorpusRecord {
  std::string tag, text, input;  // input: the raw bytes fed to us (text, or the invalid bytes)
};

const std::vector<CorpusRecord>& corpus() {
  static const std::vector<CorpusRecord> records = [] {
    std::vector<CorpusRecord> out;
    for (const std::string& line : lines_of(slurp(data_dir() + "/corpus.jsonl"))) {
      const json j = json::parse(line);
      CorpusRecord r;
      r.tag = j.at("tag").get<std::string>();
      r.text = j.at("text").get<std::string>();
      r.input = j.contains("raw_hex") ? from_hex(j["raw_hex"].get<std::string>()) : r.text;
      out.push_back(std::move(r));
    }
    return out;
  }();
  return records;
}

std::string tokenizer_dir(const std::string& name) { return tokenizers_root() + "/" + name; }

bool have_tokenizer(const std::string& name) { return fs::exists(tokenizer_dir(name) + "/tokenizer.json"); }

const Tokenizer& reference_tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, Tokenizer::from_folder(tokenizer_dir(name))).first;
  return it->second;
}

#define REQUIRE_TOKENIZER(name)                                                                   \
  if (!have_tokenizer(name))                                                                      \
  GTEST_SKIP() << tokenizer_dir(name) << "/tokenizer.json is absent: run scripts/fetch-tokenizers " \
                                         "(make test does) to fetch the reference tokenizer files"

struct Golden {
  std::vector<int32_t> ids, ids_special;
  std::string decoded, decoded_skip;
};

std::vector<Golden> load_golden(const std::string& name, json& meta) {
  const std::vector<std::string> lines = lines_of(slurp(data_dir() + "/golden_" + name + ".jsonl"));
  EXPECT_FALSE(lines.empty()) << "golden_" << name << ".jsonl is missing or empty";
  if (lines.empty()) return {};
  meta = json::parse(lines[0]).at("meta");
  std::vector<Golden> out;
  const auto& recs = corpus();
  for (size_t i = 1; i < lines.size() && i - 1 < recs.size(); ++i) {
    const json j = json::parse(lines[i]);
    Golden g;
    g.ids = j.at("ids").get<std::vector<int32_t>>();
    if (j.contains("ids_special")) {
      g.ids_special = j["ids_special"].get<std::vector<int32_t>>();
    } else {
      if (j.contains("special_prefix")) g.ids_special = j["special_prefix"].get<std::vector<int32_t>>();
      g.ids_special.insert(g.ids_special.end(), g.ids.begin(), g.ids.end());
      if (j.contains("special_suffix")) {
        auto s = j["special_suffix"].get<std::vector<int32_t>>();
        g.ids_special.insert(g.ids_special.end(), s.begin(), s.end());
      }
    }
    g.decoded = j.contains("decoded") ? j["decoded"].get<std::string>() : recs[i - 1].text;
    g.decoded_skip = j.contains("decoded_skip") ? j["decoded_skip"].get<std::string>() : g.decoded;
    out.push_back(std::move(g));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Conformance

void check_conformance(const std::string& name) {
  const Tokenizer& tok = reference_tokenizer(name);
  json meta;
  const std::vector<Golden> goldens = load_golden(name, meta);
  const auto& recs = corpus();
  ASSERT_EQ(meta.at("corpus_sha256").get<std::string>(), sha256_hex(slurp(data_dir() + "/corpus.jsonl")))
      << "golden_" << name << ".jsonl was made from another corpus: rerun tools/make_tokenizer_goldens.py";
  ASSERT_EQ(meta.at("tokenizer_json_sha256").get<std::string>(),
            sha256_hex(slurp(tokenizer_dir(name) + "/tokenizer.json")))
      << tokenizer_dir(name) << "/tokenizer.json differs from the file the goldens were made from";
  ASSERT_EQ(goldens.size(), recs.size());
  ASSERT_GE(recs.size(), 2000u);

  size_t bad_ids = 0, bad_special = 0, bad_decode = 0, bad_skip = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const CorpusRecord& r = recs[i];
    const Golden& g = goldens[i];
    const std::vector<int32_t> ids = tok.encode(r.input, false);
    if (ids != g.ids && ++bad_ids <= 5)
      ADD_FAILURE() << name << " record " << i << " (" << r.tag << ") text " << json(r.text).dump()
                    << "\n  expected " << show_ids(g.ids) << "\n  got      " << show_ids(ids);
    const std::vector<int32_t> ids_special = tok.encode(r.input, true);
    if (ids_special != g.ids_special && ++bad_special <= 5)
      ADD_FAILURE() << name << " record " << i << " with special tokens: expected " << show_ids(g.ids_special)
                    << " got " << show_ids(ids_special);
    const std::string decoded = tok.decode(g.ids, false);
    if (decoded != g.decoded && ++bad_decode <= 5)
      ADD_FAILURE() << name << " record " << i << " decode: expected " << json(g.decoded).dump() << " got "
                    << json(decoded).dump();
    const std::string skipped = tok.decode(g.ids_special, true);
    if (skipped != g.decoded_skip && ++bad_skip <= 5)
      ADD_FAILURE() << name << " record " << i << " decode skipping specials: expected "
                    << json(g.decoded_skip).dump() << " got " << json(skipped).dump();
  }
  EXPECT_EQ(bad_ids, 0u) << name << ": strings whose ids differ from the reference";
  EXPECT_EQ(bad_special, 0u) << name << ": strings whose ids with special tokens differ";
  EXPECT_EQ(bad_decode, 0u) << name << ": decodes that differ";
  EXPECT_EQ(bad_skip, 0u) << name << ": decodes skipping special tokens that differ";
}

TEST(TokenizerConformance, Qwen3) {
  REQUIRE_TOKENIZER("qwen3");
  check_conformance("qwen3");
}
TEST(TokenizerConformance, Llama3) {
  REQUIRE_TOKENIZER("llama3");
  check_conformance("llama3");
}
TEST(TokenizerConformance, Llama2) {
  REQUIRE_TOKENIZER("llama2");
  check_conformance("llama2");
}

TEST(TokenizerConformance, InvalidUtf8IsReadAsReplacementCharacters) {
  REQUIRE_TOKENIZER("qwen3");
  const Tokenizer& tok = reference_tokenizer("qwen3");
  size_t checked = 0;
  for (const CorpusRecord& r : corpus()) {
    if (r.input == r.text) continue;
    EXPECT_EQ(tok.encode(r.input, false), tok.encode(r.text, false)) << json(r.text).dump();
    ++checked;
  }
  EXPECT_GE(checked, 90u);  // the corpus has 120 such records; a few drew only valid pieces
}

TEST(TokenizerFolder, ConfigValues) {
  REQUIRE_TOKENIZER("qwen3");
  const Tokenizer& qwen = reference_tokenizer("qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_FALSE(qwen.bos_id().has_value());
  EXPECT_EQ(qwen.eos_ids(), std::vector<int32_t>{151645});
  EXPECT_NE(qwen.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(qwen.is_special(151644));
  EXPECT_FALSE(qwen.is_special(151667));  // <think> is an added token but not special
  EXPECT_EQ(qwen.piece_to_id("<think>"), 151667);
  EXPECT_EQ(qwen.id_to_piece(151644), "<|im_start|>");
  EXPECT_EQ(qwen.id_to_piece(9707), "Hello");
  EXPECT_THROW(qwen.id_to_piece(qwen.vocab_size()), ingot::Error);
  EXPECT_FALSE(qwen.piece_to_id("no such token at all").has_value());

  REQUIRE_TOKENIZER("llama2");
  const Tokenizer& llama2 = reference_tokenizer("llama2");
  EXPECT_EQ(llama2.bos_id(), 1);
  EXPECT_EQ(llama2.eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(llama2.chat_template(), "");
  EXPECT_EQ(llama2.encode("Hello", true).front(), 1);
}

// ---------------------------------------------------------------------------------------------
// Streaming

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder dec(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(ingot::tok::detail::utf8_is_valid(piece)) << "push emitted broken UTF-8";
    out += piece;
  }
  out += dec.flush();
  return out;
}

void check_stream_matches_decode(const std::string& name) {
  const Tokenizer& tok = reference_tokenizer(name);
  size_t bad = 0;
  for (const CorpusRecord& r : corpus()) {
    const std::vector<int32_t> ids = tok.encode(r.input, true);
    for (bool skip : {false, true}) {
      const std::string want = tok.decode(ids, skip);
      const std::string got = stream_all(tok, ids, skip);
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << name << " skip=" << skip << " " << json(r.text).dump() << "\n  decode " << json(want).dump()
                      << "\n  stream " << json(got).dump();
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(StreamDecoder, MatchesDecodeOnCorpusQwen3) {
  REQUIRE_TOKENIZER("qwen3");
  check_stream_matches_decode("qwen3");
}
TEST(StreamDecoder, MatchesDecodeOnCorpusLlama3) {
  REQUIRE_TOKENIZER("llama3");
  check_stream_matches_decode("llama3");
}
TEST(StreamDecoder, MatchesDecodeOnCorpusLlama2) {
  REQUIRE_TOKENIZER("llama2");
  check_stream_matches_decode("llama2");
}

// Pushes the ids of text one by one; returns what each push emitted.
std::vector<std::string> pushes(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder dec(tok, true);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(dec.push(id));
  return out;
}

void check_split_character(const std::string& name) {
  const Tokenizer& tok = reference_tokenizer(name);
  // U+1FAE0 (melting face) is rare enough to be split into byte tokens by every vocabulary here.
  const std::string text = "a\xF0\x9F\xAB\xA0" "b";
  const std::vector<int32_t> ids = tok.encode(text, false);
  const std::vector<std::string> out = pushes(tok, ids);
  std::string joined;
  size_t emoji_at = out.size();
  for (size_t i = 0; i < out.size(); ++i) {
    joined += out[i];
    if (emoji_at == out.size() && joined.find("\xF0\x9F\xAB\xA0") != std::string::npos) emoji_at = i;
  }
  ASSERT_LT(emoji_at, out.size()) << name << ": the emoji never appeared";
  // Every push before the one completing the emoji gave only whole characters ("a" or nothing).
  for (size_t i = 0; i < emoji_at; ++i) EXPECT_TRUE(out[i].empty() || out[i] == "a") << name << " push " << i;
  // The push with the emoji's last byte emitted it at once.
  EXPECT_NE(out[emoji_at].find("\xF0\x9F\xAB\xA0"), std::string::npos);
  EXPECT_EQ(joined, tok.decode(ids, true));
  EXPECT_GE(ids.size(), 4u) << name << ": expected the emoji to take several byte tokens";
}

TEST(StreamDecoder, HoldsSplitCharacterUntilComplete) {
  for (const char* name : {"qwen3", "llama3", "llama2"}) {
    REQUIRE_TOKENIZER(name);
    check_split_character(name);
  }
}

TEST(StreamDecoder, FlushTurnsUnfinishedCharacterIntoReplacement) {
  for (const char* name : {"qwen3", "llama2"}) {
    REQUIRE_TOKENIZER(name);
    const Tokenizer& tok = reference_tokenizer(name);
    std::vector<int32_t> ids = tok.encode("x\xF0\x9F\xAB\xA0", false);
    ids.pop_back();  // drop the emoji's last byte
    StreamDecoder dec(tok);
    std::string out;
    for (int32_t id : ids) out += dec.push(id);
    EXPECT_EQ(out, "x");
    const std::string rest = dec.flush();
    EXPECT_TRUE(ingot::tok::detail::utf8_is_valid(rest));
    EXPECT_NE(rest.find("\xEF\xBF\xBD"), std::string::npos) << name;
    EXPECT_EQ(out + rest, tok.decode(ids, true));
  }
}

TEST(StreamDecoder, EmojiSequencesAndSpacing) {
  REQUIRE_TOKENIZER("llama2");
  const Tokenizer& tok = reference_tokenizer("llama2");
  // Llama 2's decoder strips the first space only: streaming must keep the later ones.
  const std::string text = "Hello world 👨‍👩‍👧‍👦 again 👍🏽";
  const std::vector<int32_t> ids = tok.encode(text, true);
  std::string joined;
  for (const std::string& s : pushes(tok, ids)) joined += s;
  EXPECT_EQ(joined, text);
}

TEST(StreamDecoder, RandomIdsMatchDecodeForByteLevel) {
  // Arbitrary id sequences make arbitrary byte sequences, valid or not; with byte-level decoding
  // the stream must still add up to decode().
  for (const char* name : {"qwen3", "llama3"}) {
    REQUIRE_TOKENIZER(name);
    const Tokenizer& tok = reference_tokenizer(name);
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> any(0, tok.vocab_size() + 10);
    std::uniform_int_distribution<int32_t> bytes(0, 255);  // single-byte tokens, often partial chars
    for (int round = 0; round < 300; ++round) {
      std::vector<int32_t> ids;
      for (int k = 0; k < 20; ++k) ids.push_back(k % 3 ? bytes(rng) : any(rng));
      for (bool skip : {false, true}) EXPECT_EQ(stream_all(tok, ids, skip), tok.decode(ids, skip)) << name;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ingot_tok_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
  // Expects loading to fail with a message containing every fragment.
  void expect_error(const std::string& json_text, std::vector<std::string> fragments) {
    const std::string path = write("tokenizer.json", json_text);
    try {
      Tokenizer::from_file(path);
      ADD_FAILURE() << "loading succeeded for " << json_text;
    } catch (const ingot::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
  }
  fs::path dir_;
};

const char* kModel = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]})";

std::string tokenizer_json(const std::string& model, const std::string& extra = "") {
  return R"({"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,)"
         R"("post_processor":null,"decoder":null)" + extra + R"(,"model":)" + model + "}";
}

TEST_F(TokenizerFiles, MissingFile) {
  try {
    Tokenizer::from_file((dir_ / "nope.json").string());
    FAIL() << "expected an error";
  } catch (const ingot::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
  EXPECT_THROW(Tokenizer::from_folder((dir_ / "missing_dir").string()), ingot::Error);
  EXPECT_THROW(Tokenizer::from_folder(dir_.string()), ingot::Error);  // folder without tokenizer.json
}

TEST_F(TokenizerFiles, BadJson) { expect_error(R"({"model": {"vocab": )", {"invalid JSON"}); }
TEST_F(TokenizerFiles, NotAnObject) { expect_error("[1,2,3]", {"object"}); }
TEST_F(TokenizerFiles, MissingModel) { expect_error(R"({"version":"1.0","added_tokens":[]})", {"'model'"}); }
TEST_F(TokenizerFiles, UnknownModelType) {
  expect_error(tokenizer_json(R"({"type":"Unigram","vocab":[["a",0.0]]})"), {"model", "Unigram", "not supported"});
}
TEST_F(TokenizerFiles, MergeTokenNotInVocab) {
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]})"),
               {"model.merges[0]", "\"c\"", "not in the vocabulary"});
}
TEST_F(TokenizerFiles, MergedTokenNotInVocab) {
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]})"),
               {"model.merges[0]", "\"ab\""});
}
TEST_F(TokenizerFiles, MalformedMerge) {
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b", "ab"]})"),
               {"model.merges[1]", "two tokens"});
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[7]})"), {"model.merges[0]"});
}
TEST_F(TokenizerFiles, BadVocab) {
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":{"a":-3},"merges":[]})"), {"model.vocab", "\"a\""});
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":{"a":0,"b":0},"merges":[]})"), {"id 0"});
  expect_error(tokenizer_json(R"({"type":"BPE","vocab":[],"merges":[]})"), {"model.vocab"});
}
TEST_F(TokenizerFiles, UnsupportedParts) {
  expect_error(R"({"normalizer":{"type":"Lowercase"},"model":)" + std::string(kModel) + "}", {"normalizer", "Lowercase"});
  expect_error(R"({"pre_tokenizer":{"type":"Whitespace"},"model":)" + std::string(kModel) + "}",
               {"pre_tokenizer", "Whitespace"});
  expect_error(R"({"decoder":{"type":"WordPiece"},"model":)" + std::string(kModel) + "}", {"decoder", "WordPiece"});
  expect_error(R"({"post_processor":{"type":"Nope"},"model":)" + std::string(kModel) + "}", {"post_processor", "Nope"});
  expect_error(R"({"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"ByteLevel"},)"
               R"({"type":"Split","pattern":{"String":"x"},"behavior":"Isolated","invert":false}]},"model":)" +
                   std::string(kModel) + "}",
               {"pretokenizers[1]", "ByteLevel must come last"});
  expect_error(R"({"truncation":{"max_length":8},"model":)" + std::string(kModel) + "}", {"truncation"});
  expect_error(tokenizer_json(R"({"type":"BPE","dropout":0.1,"vocab":{"a":0},"merges":[]})"), {"dropout"});
}
TEST_F(TokenizerFiles, BadRegex) {
  expect_error(R"({"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false},)"
               R"("model":)" + std::string(kModel) + "}",
               {"pre_tokenizer.pattern.Regex", "(unclosed"});
  expect_error(R"({"pre_tokenizer":{"type":"Split","pattern":{"Regex":"a"},"behavior":"Sideways","invert":false},)"
               R"("model":)" + std::string(kModel) + "}",
               {"behavior", "Sideways"});
}
TEST_F(TokenizerFiles, AddedTokenIdInconsistent) {
  expect_error(tokenizer_json(kModel).replace(tokenizer_json(kModel).find(R"("added_tokens":[])"), 17,
                                              R"("added_tokens":[{"id":9,"content":"<x>","special":true}])"),
               {"added_tokens[0]", "<x>", "id 9", "id 3"});
}
TEST_F(TokenizerFiles, PostProcessorIdNotInVocab) {
  expect_error(R"({"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},)"
               R"({"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<s>":{"id":"<s>","ids":[7],"tokens":["<s>"]}}},)"
               R"("model":)" + std::string(kModel) + "}",
               {"post_processor.special_tokens[\"<s>\"].ids", "id 7"});
  expect_error(R"({"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}}],)"
               R"("special_tokens":{}},"model":)" + std::string(kModel) + "}",
               {"post_processor.single[0]", "<s>"});
}

TEST_F(TokenizerFiles, ConfigTokenNotInVocab) {
  write("tokenizer.json", tokenizer_json(kModel));
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  try {
    Tokenizer::from_folder(dir_.string());
    FAIL() << "expected an error";
  } catch (const ingot::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bos_token"), std::string::npos) << e.what();
  }
  write("tokenizer_config.json", R"({"bos_token": )");
  EXPECT_THROW(Tokenizer::from_folder(dir_.string()), ingot::Error);
}

// ---------------------------------------------------------------------------------------------
// Features the three reference files do not exercise, checked on small hand-made tokenizers.
// Expected values follow the reference's documented behavior.

std::vector<std::string> pre_tokenize(const std::string& pre_json, const std::string& text) {
  const auto chain = ingot::tok::detail::make_pre_tokenizer(json::parse(pre_json), "test");
  std::vector<std::string> out;
  chain.run(text, true, [&](std::string_view w, bool) { out.emplace_back(w); });
  return out;
}

std::string split_json(const std::string& behavior, bool invert = false) {
  return R"({"type":"Split","pattern":{"String":"-"},"behavior":")" + behavior + R"(","invert":)" +
         (invert ? "true" : "false") + "}";
}

TEST(TokenizerParts, SplitBehaviors) {
  using V = std::vector<std::string>;
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split_json("Removed"), text), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_json("Isolated"), text), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_json("MergedWithPrevious"), text), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_json("MergedWithNext"), text), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split_json("Contiguous"), text), (V{"the", "-", "final", "--", "countdown"}));
  // Inverted, the pattern names what to keep: Removed keeps only the matches.
  EXPECT_EQ(pre_tokenize(split_json("Removed", true), text), (V{"-", "-", "-"}));
}

TEST(TokenizerParts, RegexFollowsOniguruma) {
  // U+180E is not White_Space, so \s must not match it (PCRE2's own \s would).
  const std::string pre = R"({"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Removed","invert":false})";
  EXPECT_EQ(pre_tokenize(pre, "a\xE1\xA0\x8E" "b c"), (std::vector<std::string>{"a\xE1\xA0\x8E" "b", "c"}));
  EXPECT_EQ(pre_tokenize(pre, "a\xE3\x80\x80" "b"), (std::vector<std::string>{"a", "b"}));  // U+3000 is
}

TEST(TokenizerParts, MetaspacePreTokenizer) {
  const std::string pre = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})";
  EXPECT_EQ(pre_tokenize(pre, "Hey   friend!"), (std::vector<std::string>{"▁Hey", "▁", "▁", "▁friend!"}));
}

TEST_F(TokenizerFiles, AddedTokenFlags) {
  // A character-level BPE: every piece that is not an added token comes out one id per character.
  json vocab = json::object();
  const std::string chars = " abcdehilmnorsty[]ACELNPS";
  for (size_t i = 0; i < chars.size(); ++i) vocab[std::string(1, chars[i])] = static_cast<int>(i);
  const int n = static_cast<int>(chars.size());
  json added = json::array({
      {{"id", n}, {"content", "my"}, {"lstrip", true}, {"rstrip", true}, {"single_word", false}, {"normalized", false}, {"special", false}},
      {{"id", n + 1}, {"content", "name"}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}, {"normalized", false}, {"special", false}},
      {{"id", n + 2}, {"content", "ony"}, {"lstrip", false}, {"rstrip", false}, {"single_word", true}, {"normalized", false}, {"special", false}},
      {{"id", n + 3}, {"content", "[CLS]"}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}, {"normalized", false}, {"special", true}},
      {{"id", n + 4}, {"content", "[SEP]"}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}, {"normalized", false}, {"special", true}},
  });
  json root = {{"version", "1.0"}, {"added_tokens", added}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr},
               {"post_processor", nullptr}, {"decoder", nullptr},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  const Tokenizer tok = Tokenizer::from_file(write("tokenizer.json", root.dump()));
  auto ids_of = [&](const std::string& s) {
    std::vector<int32_t> v;
    for (char c : s) v.push_back(static_cast<int32_t>(chars.find(c)));
    return v;
  };
  // Reference behaviour: " my " is taken whole by lstrip/rstrip, "ony" inside "anthony" is not a
  // single word so it stays text.
  std::vector<int32_t> want = {n + 3};
  want.push_back(n);
  want.push_back(n + 1);
  for (int32_t id : ids_of(" is anthony ")) want.push_back(id);
  want.push_back(n + 4);
  EXPECT_EQ(tok.encode("[CLS] my name is anthony [SEP]", false), want);
  EXPECT_TRUE(tok.is_special(n + 3));
  EXPECT_FALSE(tok.is_special(n));
  // No decoder: tokens are joined with spaces; special ones can be skipped.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{n + 3, n + 1, n + 4}, false), "[CLS] name [SEP]");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{n + 3, n + 1, n + 4}, true), "name");
}

TEST_F(TokenizerFiles, MergeAcrossSpaceMarkerIsKept) {
  // SentencePiece-style words are merged in pieces cut before "▁" only when no token spans such a
  // cut; here "a▁" is a token, so the whole word must be merged as one.
  const std::string model = R"({"type":"BPE","vocab":{"a":0,"▁":1,"b":2,"a▁":3,"▁b":4},"merges":["a ▁","▁ b"]})";
  const std::string normalizer = R"({"type":"Replace","pattern":{"String":" "},"content":"▁"})";
  const Tokenizer tok = Tokenizer::from_file(write("tokenizer.json", R"({"normalizer":)" + normalizer +
                                                                    R"(,"model":)" + model + "}"));
  EXPECT_EQ(tok.encode("a b", false), (std::vector<int32_t>{3, 2}));
  // Without the spanning token the cut applies, with the same result as merging the whole word.
  const std::string model2 = R"({"type":"BPE","vocab":{"a":0,"▁":1,"b":2,"▁b":4},"merges":["▁ b"]})";
  const Tokenizer tok2 = Tokenizer::from_file(write("tokenizer.json", R"({"normalizer":)" + normalizer +
                                                                     R"(,"model":)" + model2 + "}"));
  EXPECT_EQ(tok2.encode("a b", false), (std::vector<int32_t>{0, 4}));
}

// A GPT-2-style file: ByteLevel as the only pre-tokenizer, splitting with its own regex. The
// vocabulary holds the byte-level characters below and the tokens their merges make; the expected
// ids are worked out by hand from the merge ranks.
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string gpt2_style_json(const json& pre_tokenizer) {
  // Ids 0..13: "Ġ" is the space byte, "Ċ" the newline byte.
  const std::vector<std::string> base = {"Ġ", "h", "e", "l", "o", "w", "r", "d", "'", "s", "1", "2", "!", "Ċ"};
  // In rank order; the merged tokens get ids 14 onwards.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},   {"l", "l"},   {"he", "ll"},   {"hell", "o"},   {"Ġ", "w"}, {"o", "r"},
      {"Ġw", "or"}, {"Ġwor", "l"}, {"d", "'"},     {"Ġworl", "d"}, {"'", "s"}, {"1", "2"}};
  json vocab = json::object();
  for (size_t i = 0; i < base.size(); ++i) vocab[base[i]] = static_cast<int>(i);
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(a + " " + b);
  }
  json root = {{"version", "1.0"}, {"added_tokens", json::array()}, {"normalizer", nullptr},
               {"pre_tokenizer", pre_tokenizer}, {"post_processor", nullptr},
               {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
  return root.dump();
}

json byte_level_json(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

TEST(TokenizerParts, ByteLevelSplitsWithTheGpt2Regex) {
  using V = std::vector<int32_t>;
  const Tokenizer tok = Tokenizer::from_json(gpt2_style_json(byte_level_json(false, true)), "gpt2-style");
  // Words "hello" " world" "'s" " 12" "!": hello=17, Ġworld=23, 's=24, Ġ=0 12=25, !=12.
  EXPECT_EQ(tok.encode("hello world's 12!", false), (V{17, 23, 24, 0, 25, 12}));
  // "  \n" is one word (whitespace not followed by non-space), then "\n", then "world", which has
  // no "Ġ" and so merges only "o r": w=5 or=19 l=3 d=7.
  EXPECT_EQ(tok.encode("hello  \n\nworld", false), (V{17, 0, 0, 13, 13, 5, 19, 3, 7}));
  EXPECT_EQ(tok.decode(tok.encode("hello world's 12!", false), false), "hello world's 12!");

  // Unsplit, "d '" (rank 8) would merge before "Ġworl d" (rank 9): the split is what prevents it.
  const Tokenizer whole = Tokenizer::from_json(gpt2_style_json(byte_level_json(false, false)), "unsplit");
  EXPECT_EQ(whole.encode("hello world's 12!", false), (V{17, 21, 22, 9, 0, 25, 12}));

  // add_prefix_space puts a space before text that does not start with one.
  const Tokenizer spaced = Tokenizer::from_json(gpt2_style_json(byte_level_json(true, true)), "prefixed");
  EXPECT_EQ(spaced.encode("hello", false), (V{0, 17}));
  EXPECT_EQ(spaced.encode(" world", false), (V{23}));

  // The same as splitting first with the pattern and then byte-mapping without a regex.
  const json seq = {{"type", "Sequence"},
                    {"pretokenizers",
                     json::array({{{"type", "Split"}, {"pattern", {{"Regex", kGpt2Pattern}}}, {"behavior", "Isolated"},
                                   {"invert", false}},
                                  byte_level_json(false, false)})}};
  const Tokenizer split_then_map = Tokenizer::from_json(gpt2_style_json(seq), "sequence");
  for (const std::string s : {"hello world's 12!", "hello  \n\nworld", "  hello!!  world's'd 1212 ", "he'll\t\there'S",
                              "w\xC3\xB6rld 12ab!! \xE4\xB8\xAD", ""}) {
    EXPECT_EQ(tok.encode(s, false), split_then_map.encode(s, false)) << json(s).dump();
    if (!s.empty()) EXPECT_FALSE(tok.encode(s, false).empty()) << json(s).dump();
  }
}

TEST_F(TokenizerFiles, FromTextsIsFromFolder) {
  const std::string config =
      R"({"bos_token": "a", "eos_token": {"content": "b"}, "chat_template": "from the config"})";
  const std::string jinja = "from the jinja file";
  const std::string generation = R"({"eos_token_id": [2, 1]})";
  write("tokenizer.json", tokenizer_json(kModel));
  write("tokenizer_config.json", config);
  write("chat_template.jinja", jinja);
  write("generation_config.json", generation);
  const Tokenizer folder = Tokenizer::from_folder(dir_.string());
  const Tokenizer texts = Tokenizer::from_texts(tokenizer_json(kModel), config, jinja, generation, "engine.ingot");
  for (const Tokenizer* t : {&folder, &texts}) {
    EXPECT_EQ(t->bos_id(), 0);
    EXPECT_EQ(t->eos_ids(), (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(t->chat_template(), jinja);
    EXPECT_EQ(t->encode("ab", false), std::vector<int32_t>{2});
  }
  const Tokenizer bare = Tokenizer::from_texts(tokenizer_json(kModel), config, std::nullopt, std::nullopt, "x");
  EXPECT_EQ(bare.chat_template(), "from the config");
  EXPECT_EQ(bare.eos_ids(), std::vector<int32_t>{1});

  try {
    Tokenizer::from_texts(tokenizer_json(kModel), R"({"eos_token": "zz"})", std::nullopt, std::nullopt, "engine.ingot");
    FAIL() << "expected an error";
  } catch (const ingot::Error& e) {
    EXPECT_NE(std::string(e.what()).find("engine.ingot/tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eos_token"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_texts("{", std::nullopt, std::nullopt, std::nullopt, "engine.ingot");
    FAIL() << "expected an error";
  } catch (const ingot::Error& e) {
    EXPECT_NE(std::string(e.what()).find("engine.ingot/tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(TokenizerParts, NfcSkipsOnlyWhatCannotChange) {
  // The NFC normalizer skips text that is already NFC and normalizes only the regions that may
  // change; on any mix of characters it must agree with utf8proc normalizing the whole string.
  const auto nfc = ingot::tok::detail::make_normalizer(json::parse(R"({"type":"NFC"})"), "test");
  const char32_t pool[] = {'a', 'e', 'A', ' ', 0x301, 0x308, 0x323, 0x327, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x3099,
                           0x304B, 0x212B, 0x2126, 0x958, 0x9BE, 0x9C7, 0xB47, 0xB3E, 0x3AC, 0x1F71, 0x374, 0x4E2D,
                           0xE9, 0x1E9B, 0x5B0, 0x5D0, 0xFB2C, 0x1D15E, 0x110A5, 0x11131, 0x0F73, 0x0F71, 0x0F72};
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> pick(0, std::size(pool) - 1), len(1, 12);
  for (int round = 0; round < 20000; ++round) {
    std::string s;
    for (size_t k = len(rng); k > 0; --k) ingot::tok::detail::utf8_append(s, pool[pick(rng)]);
    utf8proc_uint8_t* whole = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
    std::string got = s;
    nfc->normalize(got);
    ASSERT_EQ(got, std::string(reinterpret_cast<const char*>(whole))) << json(s).dump();
    std::free(whole);
  }
}

TEST(TokenizerParts, Utf8Replacement) {
  using ingot::tok::detail::utf8_replace_invalid;
  const std::string r = "\xEF\xBF\xBD";
  // Maximal subparts, as Python's decode(errors="replace") counts them.
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(utf8_replace_invalid("\xE2\x82"), r);
  EXPECT_EQ(utf8_replace_invalid("a\xF0\x9F\x98"), "a" + r);
  EXPECT_EQ(utf8_replace_invalid("\xC3\x28"), r + "(");
  EXPECT_EQ(utf8_replace_invalid("\xF8\x88\x80\x80\x80"), r + r + r + r + r);
  EXPECT_EQ(utf8_replace_invalid("\xE0\x80\xAF"), r + r + r);
  EXPECT_EQ(utf8_replace_invalid("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
  EXPECT_EQ(ingot::tok::detail::utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(ingot::tok::detail::utf8_incomplete_tail("a\xED\xA0"), 0u);  // already invalid
  EXPECT_EQ(ingot::tok::detail::utf8_incomplete_tail("a\xE4\xB8\xAD"), 0u);
}

}  // namespace
