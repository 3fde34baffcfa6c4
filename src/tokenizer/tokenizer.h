// Hugging Face tokenizer.json in C++: encode text to token ids and decode ids to text with exactly
// the results of the reference `tokenizers` library (proven on a committed corpus, see
// docs/tokenizer.md), plus an incremental decoder for streaming generation.
//
// Supported: the BPE model (byte-level as in Qwen2/Qwen3/Llama 3, and SentencePiece-style with "▁"
// and byte fallback as in Llama 2), normalizers NFC/NFD/NFKC/NFKD/Prepend/Replace/Strip/Sequence,
// pre-tokenizers Split/ByteLevel/Metaspace/Sequence, added tokens with all their flags,
// post-processors TemplateProcessing/ByteLevel/Bert/Roberta/Sequence, decoders
// ByteLevel/Metaspace/ByteFallback/Fuse/Strip/Replace/Sequence. Anything else is refused at load
// with an ingot::Error naming the file and field.
//
// Input that is not valid UTF-8 is tokenized as if each maximal invalid subpart were U+FFFD (the
// rule of Python's bytes.decode(errors="replace")).
//
// A Tokenizer is a cheap-to-copy value: copies share the immutable tables. All const methods may
// be called from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ingot::tok {

class Tokenizer {
 public:
  // Loads a tokenizer.json. Throws ingot::Error naming the file and field on any problem.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Same, from the text of a tokenizer.json; `source_name` stands for the file in messages.
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& source_name);
  // Loads <dir>/tokenizer.json plus, when present, <dir>/tokenizer_config.json (bos/eos tokens,
  // chat_template), <dir>/chat_template.jinja (preferred over the config's template) and
  // <dir>/generation_config.json (its eos_token_id ids join eos_ids()).
  static Tokenizer from_folder(const std::string& dir);
  // from_folder's loading from the files' texts; a missing optional file is std::nullopt.
  // Messages name each text as the file it stands for inside a folder called `source_name`
  // (e.g. "<source_name>/tokenizer_config.json").
  static Tokenizer from_texts(std::string_view tokenizer_json, std::optional<std::string_view> tokenizer_config_json,
                              std::optional<std::string_view> chat_template_jinja,
                              std::optional<std::string_view> generation_config_json,
                              const std::string& source_name);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Unknown ids are dropped, as the reference does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // The token's string as stored in tokenizer.json (byte-level tokens stay in their mapped form).
  // Throws ingot::Error for an id outside the vocabulary.
  std::string id_to_piece(int32_t id) const;
  std::optional<int32_t> piece_to_id(std::string_view piece) const;
  // One past the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::vector<int32_t> eos_ids() const;
  const std::string& chat_template() const;  // "" if none
  // Tokens marked special (skipped by decode(..., skip_special_tokens=true)).
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// Incremental detokenizer for streaming generation: push(id) returns the text that id completed.
// Output is always valid UTF-8; a character split across tokens is held back until its last byte
// arrives and then emitted at once. The concatenation of all push() results and flush() equals
// decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  std::string push(int32_t id);
  // Emits whatever is held back (an unfinished character becomes U+FFFD) and starts afresh.
  std::string flush();

 private:
  Tokenizer tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // context ids (already emitted) followed by pending ones
  size_t context_ = 0;        // how many of ids_ are context
  std::string context_text_;  // decode of the context ids
};

}  // namespace ingot::tok
