// Pre-tokenizers of tokenizer.json: Split (regex or literal, every delimiter behavior, invert),
// ByteLevel, Metaspace and Sequence, plus the GPT-2 byte-level alphabet.
#include <algorithm>
#include <utility>

#include "tokenizer/components.h"

namespace ingot::tok::detail {

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet: printable bytes stand for themselves, the other 68 bytes are given the
// characters U+0100 onwards in byte order.

namespace {
struct ByteAlphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};
  ByteAlphabet() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

char32_t byte_to_char(uint8_t b) { return alphabet().to_char[b]; }
int char_to_byte(char32_t c) { return c < 0x144 ? alphabet().to_byte[c] : -1; }

// ---------------------------------------------------------------------------------------------

void PreTokenizerChain::run_from(size_t step, std::string_view piece, bool at_start, PieceFn out) const {
  if (step == steps.size()) {
    out(piece, at_start);
    return;
  }
  steps[step]->split(piece, at_start, [&](std::string_view sub, bool sub_at_start) {
    run_from(step + 1, sub, sub_at_start, out);
  });
}

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const json& j, const std::string& where) {
  const std::string b = require_string(j, "behavior", where);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  throw Error(where + ".behavior: unknown value '" + b +
              "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

struct Segment {
  size_t begin, end;
  bool flag;  // is a delimiter (before behaviors) / is to be removed (after)
};

// Turns the (offsets, is_match) cover of a string into the pieces to keep, as the reference's
// NormalizedString::split does for each behavior.
void apply_behavior(std::vector<Segment>& segs, Behavior behavior) {
  std::vector<Segment> out;
  out.reserve(segs.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (auto& s : segs) out.push_back({s.begin, s.end, false});
      break;
    case Behavior::Removed:
      out = segs;
      break;
    case Behavior::Contiguous:
      for (auto& s : segs) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    case Behavior::MergedWithPrevious:
      for (auto& s : segs) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  segs.swap(out);
}

// Cover of s by regex matches and the gaps between them. Empty matches split nothing.
void regex_segments(const Regex& re, std::string_view s, std::vector<Segment>& segs) {
  size_t prev = 0, from = 0, b, e;
  while (from <= s.size() && re.find(s, from, b, e)) {
    if (e == b) {
      if (b >= s.size()) break;
      size_t next = b;
      utf8_next(s, next);
      from = next;
      continue;
    }
    if (b > prev) segs.push_back({prev, b, false});
    segs.push_back({b, e, true});
    prev = from = e;
  }
  if (prev < s.size()) segs.push_back({prev, s.size(), false});
}

void literal_segments(std::string_view lit, std::string_view s, std::vector<Segment>& segs) {
  if (lit.empty()) {
    segs.push_back({0, s.size(), false});
    return;
  }
  size_t prev = 0;
  for (size_t f; (f = s.find(lit, prev)) != std::string_view::npos; prev = f + lit.size()) {
    if (f > prev) segs.push_back({prev, f, false});
    segs.push_back({f, f + lit.size(), true});
  }
  if (prev < s.size()) segs.push_back({prev, s.size(), false});
}

void emit_segments(const std::vector<Segment>& segs, std::string_view s, bool at_start, PieceFn out) {
  for (const auto& sg : segs) {
    if (sg.flag || sg.end <= sg.begin) continue;
    out(s.substr(sg.begin, sg.end - sg.begin), at_start && sg.begin == 0);
  }
}

// Behavior Isolated without invert: every match and every gap is a piece. Done directly, without
// the segment bookkeeping, since this is what most byte-level tokenizers run on all their text.
void split_isolated(const Regex& re, std::string_view s, bool at_start, PieceFn out) {
  size_t prev = 0, from = 0, b, e;
  while (from <= s.size() && re.find(s, from, b, e)) {
    if (e == b) {
      if (b >= s.size()) break;
      size_t next = b;
      utf8_next(s, next);
      from = next;
      continue;
    }
    if (b > prev) out(s.substr(prev, b - prev), at_start && prev == 0);
    out(s.substr(b, e - b), at_start && b == 0);
    prev = from = e;
  }
  if (prev < s.size()) out(s.substr(prev), at_start && prev == 0);
}

class Split final : public PreTokenizer {
 public:
  Split(const json& j, const std::string& where) {
    const json& pat = require_field(j, "pattern", where);
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      regex_.emplace(pat["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      literal_ = pat["String"].get<std::string>();
    } else {
      throw Error(where + ".pattern: expected {\"Regex\": string} or {\"String\": string}");
    }
    behavior_ = parse_behavior(j, where);
    invert_ = get_bool(j, "invert", false, where);
  }

  void split(std::string_view s, bool at_start, PieceFn out) const override {
    if (s.empty()) return;
    if (regex_ && behavior_ == Behavior::Isolated && !invert_) {
      split_isolated(*regex_, s, at_start, out);  // the common case (Qwen, Llama 3)
      return;
    }
    std::vector<Segment> segs;
    if (regex_) {
      regex_segments(*regex_, s, segs);
    } else {
      literal_segments(literal_, s, segs);
    }
    if (invert_)
      for (auto& sg : segs) sg.flag = !sg.flag;
    apply_behavior(segs, behavior_);
    emit_segments(segs, s, at_start, out);
  }

 private:
  std::optional<Regex> regex_;
  std::string literal_;
  Behavior behavior_ = Behavior::Isolated;
  bool invert_ = false;
};

const Regex& gpt2_regex() {
  static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                        "ByteLevel pre-tokenizer");
  return re;
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void split(std::string_view s, bool at_start, PieceFn out) const override {
    std::string spaced;
    if (add_prefix_space_ && (s.empty() || s.front() != ' ')) {
      spaced.reserve(s.size() + 1);
      spaced += ' ';
      spaced += s;
      s = spaced;
    }
    if (!use_regex_) {
      out(s, at_start);
      return;
    }
    // The reference splits with behavior Isolated: matches are pieces too, not delimiters.
    split_isolated(gpt2_regex(), s, at_start, out);
  }

 private:
  bool add_prefix_space_, use_regex_;
};

class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(const json& j, const std::string& where) {
    replacement_ = require_string(j, "replacement", where);
    size_t i = 0;
    if (replacement_.empty() || !utf8_is_valid(replacement_) || (utf8_next(replacement_, i), i != replacement_.size()))
      throw Error(where + ".replacement: expected exactly one character");
    std::string scheme;
    if (get_optional_string(j, "prepend_scheme", scheme, where)) {
      if (scheme == "always") prepend_ = Prepend::Always;
      else if (scheme == "first") prepend_ = Prepend::First;
      else if (scheme == "never") prepend_ = Prepend::Never;
      else throw Error(where + ".prepend_scheme: unknown value '" + scheme + "' (expected always, first or never)");
    } else {
      // Files written before prepend_scheme existed carry add_prefix_space instead.
      prepend_ = get_bool(j, "add_prefix_space", true, where) ? Prepend::Always : Prepend::Never;
    }
    split_ = get_bool(j, "split", true, where);
  }
  void split(std::string_view piece, bool at_start, PieceFn out) const override {
    std::string s;
    s.reserve(piece.size() + replacement_.size());
    for (char c : piece) {
      if (c == ' ') s += replacement_;
      else s += c;
    }
    const bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
    if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && at_start)))
      s.insert(0, replacement_);
    if (!split_) {
      out(s, at_start);
      return;
    }
    std::vector<Segment> segs;
    literal_segments(replacement_, s, segs);
    apply_behavior(segs, Behavior::MergedWithNext);
    emit_segments(segs, s, at_start, out);
  }

 private:
  std::string replacement_;
  Prepend prepend_ = Prepend::Always;
  bool split_ = true;
};

void build(const json& j, const std::string& where, PreTokenizerChain& chain, int depth) {
  if (depth > kMaxNesting) throw Error(where + ": Sequence nested more than " + std::to_string(kMaxNesting) + " deep");
  if (chain.byte_level)
    throw Error(where + ": a pre-tokenizer after ByteLevel is not supported (ByteLevel must come last)");
  const std::string type = require_string(j, "type", where);
  if (type == "Sequence") {
    const json& list = require_field(j, "pretokenizers", where);
    if (!list.is_array()) throw Error(where + ".pretokenizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      build(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", chain, depth + 1);
  } else if (type == "Split") {
    chain.steps.push_back(std::make_unique<Split>(j, where));
  } else if (type == "ByteLevel") {
    const bool prefix = get_bool(j, "add_prefix_space", true, where);
    const bool use_regex = get_bool(j, "use_regex", true, where);
    if (prefix || use_regex) chain.steps.push_back(std::make_unique<ByteLevel>(prefix, use_regex));
    chain.byte_level = true;
  } else if (type == "Metaspace") {
    chain.steps.push_back(std::make_unique<Metaspace>(j, where));
  } else {
    throw Error(where + ".type: pre-tokenizer '" + type +
                "' is not supported (supported: Split, ByteLevel, Metaspace, Sequence)");
  }
}

}  // namespace

PreTokenizerChain make_pre_tokenizer(const json& j, const std::string& where) {
  PreTokenizerChain chain;
  if (!j.is_null()) build(j, where, chain, 0);
  return chain;
}

}  // namespace ingot::tok::detail
