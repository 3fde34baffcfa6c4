// libFuzzer target: loading a tokenizer.json from arbitrary bytes either succeeds or throws
// ingot::Error; it never crashes, hangs or trips a sanitizer. A tokenizer that loads must then
// encode and decode without failing. The first input byte picks a mode: raw JSON, or the rest of
// the input spliced into one field of a small valid tokenizer.json, so that mutations reach the
// section parsers instead of stopping at JSON syntax.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;

const char* kTemplate = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 8, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 9, "content": "<x>", "single_word": true, "lstrip": true, "rstrip": true, "normalized": true, "special": false}
  ],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"},
                 {"type": "Replace", "pattern": {"String": "  "}, "content": " "}]},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                     "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [8], "tokens": ["<s>"]}}},
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4, "c": 5, "abc": 6, "x": 7},
            "merges": ["a b", "Ġ ab", "ab c"]}
})";

std::string as_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Builds the tokenizer.json text for this input, or "" when the input cannot make one.
std::string make_input(const uint8_t* data, size_t size) {
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const int mode = data[0] % 8;
  if (mode == 0) return rest;
  json j = json::parse(kTemplate);
  // The fuzz bytes may be invalid UTF-8; going through dump(replace) keeps the JSON valid.
  const json str = json::parse(as_text(json(rest)));
  switch (mode) {
    case 1:
      j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = str;
      break;
    case 2:
      j["normalizer"]["normalizers"][1]["pattern"]["String"] = str;
      break;
    case 3:
      j["added_tokens"][1]["content"] = str;
      break;
    case 4: {
      json merges = json::array();
      const std::string s = str.get<std::string>();
      for (size_t pos = 0; pos <= s.size();) {
        size_t nl = s.find('\n', pos);
        if (nl == std::string::npos) nl = s.size();
        merges.push_back(s.substr(pos, nl - pos));
        pos = nl + 1;
      }
      j["model"]["merges"] = merges;
      break;
    }
    case 5:
      j["model"]["vocab"][str.get<std::string>()] = static_cast<int>(size % 12);
      break;
    case 6:
      j["decoder"] = {{"type", "Sequence"},
                      {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"Regex", str}}}, {"content", " "}},
                                                {{"type", "ByteFallback"}},
                                                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}})}};
      break;
    default: {
      // A whole section replaced by a JSON value from the input.
      static const char* sections[] = {"normalizer", "pre_tokenizer", "post_processor", "decoder", "model", "added_tokens"};
      if (rest.empty()) return "";
      json section;
      try {
        section = json::parse(rest.substr(1));
      } catch (const json::parse_error&) {
        return "";
      }
      j[sections[static_cast<unsigned char>(rest[0]) % 6]] = section;
    }
  }
  return as_text(j);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text = make_input(data, size);
  if (text.empty()) return 0;
  try {
    const ingot::tok::Tokenizer tok = ingot::tok::Tokenizer::from_json(text, "fuzz.json");
    const std::string sample = "ab abc <s> <x> x\xE2\x82\xAC  12\n" + std::string(reinterpret_cast<const char*>(data), size);
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(sample, special);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) std::abort();  // an id outside the vocabulary is a bug
      for (bool skip : {false, true}) {
        const std::string decoded = tok.decode(ids, skip);
        ingot::tok::StreamDecoder stream(tok, skip);
        std::string streamed;
        for (int32_t id : ids) streamed += stream.push(id);
        streamed += stream.flush();
        // Whatever the file says, text handed to the caller is valid UTF-8.
        if (!ingot::tok::detail::utf8_is_valid(decoded) || !ingot::tok::detail::utf8_is_valid(streamed)) std::abort();
      }
      for (int32_t id : ids) (void)tok.id_to_piece(id);
    }
  } catch (const ingot::Error&) {
    // Refusing a malformed file with a message is the expected outcome.
  }
  return 0;
}
