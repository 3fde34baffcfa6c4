// The stages of the tokenizer pipeline, built from the sections of tokenizer.json: normalizer,
// pre-tokenizer, BPE model, post-processor and decoder. Internal to src/tokenizer.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/internal.h"

namespace ingot::tok::detail {

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2): every byte has a printable stand-in character.
char32_t byte_to_char(uint8_t b);
int char_to_byte(char32_t c);  // -1 when c is not in the alphabet

// ---------------------------------------------------------------------------------------------
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
  // True when normalize() would leave s as it is; lets the caller skip a copy.
  virtual bool is_noop_for(std::string_view s) const = 0;
};
// Sections nest (Sequence of Sequence...); deeper than this is refused rather than recursed into.
constexpr int kMaxNesting = 32;

// nullptr for a JSON null.
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where, int depth = 0);

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers cut a piece of text into words. `at_start` tells whether the piece begins the
// input (Metaspace's prepend_scheme "first" depends on it).
using PieceFn = FnRef<void(std::string_view, bool)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::string_view piece, bool at_start, PieceFn out) const = 0;
};

struct PreTokenizerChain {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  // A ByteLevel step ends the chain: the model then receives raw bytes that stand for their
  // byte-level mapped text, so no mapped copy is ever built.
  bool byte_level = false;
  void run(std::string_view piece, bool at_start, PieceFn out) const { run_from(0, piece, at_start, out); }

 private:
  void run_from(size_t step, std::string_view piece, bool at_start, PieceFn out) const;
};
PreTokenizerChain make_pre_tokenizer(const json& j, const std::string& where);

// ---------------------------------------------------------------------------------------------
// Hash map from a pair of ids to its merge (rank, id of the merged token). Open addressing: the
// merge loop looks pairs up millions of times a second.
class PairMap {
 public:
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n);
  void insert_or_assign(int32_t a, int32_t b, uint32_t rank, int32_t new_id);
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t count_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  BpeModel(const json& model, const std::string& where);
  // Appends the ids of one word. With byte_level, `word` holds raw bytes standing for their
  // byte-level mapped text (which is what the reference model is given).
  void tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  int32_t id_limit() const { return static_cast<int32_t>(vocab_r_.size()); }
  const StringIdMap& vocab() const { return vocab_; }

 private:
  void tokenize_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view text, std::vector<int32_t>& syms) const;
  void apply_merges(std::vector<int32_t>& syms) const;

  StringIdMap vocab_;
  StringIdMap raw_vocab_;  // byte-level tokens keyed by the raw bytes they stand for
  std::vector<std::string> vocab_r_;
  std::vector<uint8_t> present_;
  PairMap merges_;
  std::optional<std::string> unk_token_;
  std::optional<int32_t> unk_id_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_fallback_ids_{};  // id of "<0xXX>", or -1
  std::array<int32_t, 256> byte_char_ids_{};      // id of each byte's mapped character, or -1
  bool byte_fast_path_ = false;                   // every byte's character is in the vocab
  // SentencePiece-style text ("▁" for spaces, no pre-tokenizer) reaches the model as one long word.
  // When no token has "▁" after another character, no merge can cross the point before such a
  // "▁", so the word is merged in pieces cut there: same ids, and the pieces can be cached.
  bool split_before_meta_ = false;

  // Bounded cache of words already merged: text repeats words constantly.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 128;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

// ---------------------------------------------------------------------------------------------
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
  // Throws when an id it adds is not a token (`known` says which ids are).
  virtual void check_ids(const FnRef<bool(int32_t)>& known) const = 0;
};
// nullptr for a JSON null.
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where, int depth = 0);

// ---------------------------------------------------------------------------------------------
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};
struct DecoderInfo {
  bool byte_level = false;     // a ByteLevel decoder turns mapped characters back into bytes
  bool byte_fallback = false;  // a ByteFallback decoder turns "<0xXX>" tokens into bytes
};
// nullptr for a JSON null.
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where, DecoderInfo& info, int depth = 0);
// Parses a byte-fallback token "<0xXX>" the way the reference does; -1 if it is not one.
int parse_byte_token(std::string_view token);

}  // namespace ingot::tok::detail
