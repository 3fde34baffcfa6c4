// libFuzzer target: encoding arbitrary bytes (valid UTF-8 or not) and decoding arbitrary ids.
// Checked properties, for every tokenizer below:
//   - every id encode() returns is inside the vocabulary;
//   - decode() and the streaming decoder return valid UTF-8;
//   - with byte-level decoding, the stream adds up to decode() exactly;
//   - for a byte-level tokenizer without normalizer, decode(encode(x)) == x for valid UTF-8 x.
// Tokenizers: two small built-in ones (byte-level with added-token flags and NFC; SentencePiece-
// style with byte fallback and unknown tokens), plus the reference Qwen3/Llama 3/Llama 2 files when
// scripts/fetch-tokenizers has put them in $INGOT_CACHE/tokenizers or ./.cache/tokenizers.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

namespace {

using ingot::tok::StreamDecoder;
using ingot::tok::Tokenizer;
using ingot::tok::detail::utf8_is_valid;

const char* kByteLevel = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 260, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 261, "content": "<pad>", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": true},
    {"id": 262, "content": "word", "single_word": true, "lstrip": false, "rstrip": false, "normalized": true, "special": false}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
  "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "ignore_merges": true, "vocab": VOCAB, "merges": ["Ġ t", "h e", "Ġt he", "e r"]}
})";

const char* kSentencePiece = R"({
  "version": "1.0",
  "added_tokens": [
    {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                     "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
            "vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "a": 3, "b": 4, "▁a": 5, "ab": 6, "▁ab": 7, "<0xC3>": 8, "<0xA9>": 9, "<0x0A>": 10},
            "merges": ["▁ a", "a b", "▁a b"]}
})";

// All 256 byte-level characters (byte b has id b) plus a few merged tokens; the added tokens take
// the next ids, 260 onwards, as the tokenizers library would assign them.
std::string byte_level_json() {
  std::string vocab = "{";
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    ingot::tok::detail::utf8_append(ch, printable ? static_cast<char32_t>(b) : next++);
    if (ch == "\"" || ch == "\\") ch = "\\" + ch;
    vocab += "\"" + ch + "\": " + std::to_string(b) + ",";
  }
  vocab += R"("Ġt": 256, "he": 257, "Ġthe": 258, "er": 259})";
  std::string text = kByteLevel;
  text.replace(text.find("VOCAB"), 5, vocab);
  return text;
}

struct Subject {
  Tokenizer tok;
  bool byte_level;  // decoding is byte-level: the stream must equal decode()
  bool lossless;    // no normalizer: decode(encode(x)) == x for valid UTF-8
};

std::vector<Subject>& subjects() {
  static std::vector<Subject> all = [] {
    std::vector<Subject> out;
    out.push_back({Tokenizer::from_json(byte_level_json(), "byte_level.json"), true, false});
    out.push_back({Tokenizer::from_json(kSentencePiece, "sentencepiece.json"), false, false});
    namespace fs = std::filesystem;
    fs::path root = ".cache/tokenizers";
    if (const char* c = std::getenv("INGOT_CACHE"); c && *c) root = fs::path(c) / "tokenizers";
    const struct {
      const char* name;
      bool byte_level, lossless;
    } refs[] = {{"qwen3", true, false}, {"llama3", true, true}, {"llama2", false, false}};
    for (const auto& r : refs)
      if (fs::exists(root / r.name / "tokenizer.json"))
        out.push_back({Tokenizer::from_folder((root / r.name).string()), r.byte_level, r.lossless});
    return out;
  }();
  return all;
}

void check_decode(const Subject& s, const std::vector<int32_t>& ids) {
  for (bool skip : {false, true}) {
    const std::string decoded = s.tok.decode(ids, skip);
    if (!utf8_is_valid(decoded)) std::abort();
    StreamDecoder stream(s.tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      if (!utf8_is_valid(piece)) std::abort();
      streamed += piece;
    }
    streamed += stream.flush();
    if (!utf8_is_valid(streamed)) std::abort();
    if (s.byte_level && streamed != decoded) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool valid = utf8_is_valid(input);
  for (const Subject& s : subjects()) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = s.tok.encode(input, special);
      for (int32_t id : ids)
        if (id < 0 || id >= s.tok.vocab_size()) std::abort();
      check_decode(s, ids);
      if (s.lossless && valid && !special && s.tok.decode(ids, false) != input) std::abort();
    }
    // The same bytes read as ids, some past the vocabulary (decode drops those).
    std::vector<int32_t> ids(size / 4);
    for (size_t i = 0; i < ids.size(); ++i) {
      uint32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      ids[i] = static_cast<int32_t>(v % static_cast<uint32_t>(s.tok.vocab_size() + 16));
    }
    check_decode(s, ids);
  }
  return 0;
}
