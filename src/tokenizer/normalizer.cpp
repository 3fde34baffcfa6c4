// Normalizers of tokenizer.json: Unicode normalization forms (through utf8proc), Prepend, Replace,
// Strip and Sequence.
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "tokenizer/components.h"

namespace ingot::tok::detail {
namespace {

bool all_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Code points that NFC leaves as they are wherever they stand: combining class 0, not the second
// half of any canonical composition, and stable on their own. Text made only of these is already
// NFC, so the (costly) normalization can be skipped. Built once from utf8proc's own tables, so it
// agrees with the normalization it stands in for.
class NfcInert {
 public:
  static const NfcInert& get() {
    static const NfcInert table;
    return table;
  }
  bool operator()(char32_t c) const { return (bits_[c >> 6] >> (c & 63)) & 1; }

 private:
  NfcInert() : bits_((0x110000 >> 6), ~0ULL) {
    utf8proc_int32_t parts[16];
    for (char32_t c = 0x80; c < 0x110000; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      const auto cp = static_cast<utf8proc_int32_t>(c);
      if (utf8proc_get_property(cp)->combining_class != 0) clear(c);
      int boundclass = 0;
      const utf8proc_ssize_t n = utf8proc_decompose_char(cp, parts, 16, UTF8PROC_DECOMPOSE, &boundclass);
      if (n < 1 || (n == 1 && parts[0] == cp)) continue;
      // Everything after the first part of a decomposition may compose with what precedes it.
      for (utf8proc_ssize_t k = 1; k < n && k < 16; ++k) clear(static_cast<char32_t>(parts[k]));
      if (!stable_alone(cp)) clear(c);
    }
  }
  static bool stable_alone(utf8proc_int32_t cp) {
    utf8proc_uint8_t in[4];
    const utf8proc_ssize_t len = utf8proc_encode_char(cp, in);
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(in, len, &out, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    const bool same = n == len && std::memcmp(out, in, static_cast<size_t>(len)) == 0;
    std::free(out);
    return same;
  }
  void clear(char32_t c) {
    if (c < 0x110000) bits_[c >> 6] &= ~(1ULL << (c & 63));
  }
  std::vector<uint64_t> bits_;
};

bool nfc_quick_yes(std::string_view s) {
  const NfcInert& inert = NfcInert::get();
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    if (!inert(utf8_next(s, i))) return false;
  }
  return true;
}

class UnicodeForm final : public Normalizer {
 public:
  UnicodeForm(int options, std::string name) : options_(utf8proc_option_t(options)), name_(std::move(name)) {}
  void normalize(std::string& s) const override {
    if (is_noop_for(s)) return;
    if (options_ == utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE)) {
      s = nfc_by_regions(s);
      return;
    }
    s = map(s);
  }
  bool is_noop_for(std::string_view s) const override {
    // ASCII is invariant under every normalization form.
    if (all_ascii(s)) return true;
    return options_ == utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE) && nfc_quick_yes(s);
  }

 private:
  // NFC only where it can change something: each run of non-inert characters together with the
  // inert character before it (which they may compose with). A boundary before an inert
  // character is a normalization boundary, so the regions normalize independently.
  std::string nfc_by_regions(std::string_view s) const {
    const NfcInert& inert = NfcInert::get();
    std::string out;
    out.reserve(s.size());
    size_t copied = 0, last_inert = 0, i = 0;
    // Reads the character at i, advances i past it, and says whether it is inert.
    auto step = [&](size_t& i) {
      if (static_cast<unsigned char>(s[i]) < 0x80) {
        ++i;
        return true;
      }
      return inert(utf8_next(s, i));
    };
    while (i < s.size()) {
      const size_t start = i;
      if (step(i)) {
        last_inert = start;
        continue;
      }
      size_t end = i;
      while (end < s.size()) {
        size_t k = end;
        if (step(k)) break;
        end = k;
      }
      out.append(s, copied, last_inert - copied);
      out += map(s.substr(last_inert, end - last_inert));
      copied = i = end;
    }
    out.append(s, copied, std::string_view::npos);
    return out;
  }
  std::string map(std::string_view s) const {
    utf8proc_uint8_t* out = nullptr;
    // An explicit length (no NULLTERM) keeps embedded NUL characters.
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out, options_);
    if (n < 0) {
      throw Error("normalizer " + name_ + ": " + utf8proc_errmsg(n));
    }
    std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

  utf8proc_option_t options_;
  std::string name_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }
  bool is_noop_for(std::string_view s) const override { return s.empty() || prepend_.empty(); }

 private:
  std::string prepend_;
};

// Replace all (non-overlapping, leftmost) occurrences of a literal string or a regex.
class Replace final : public Normalizer {
 public:
  Replace(const json& j, const std::string& where) {
    const json& pat = require_field(j, "pattern", where);
    content_ = require_string(j, "content", where);
    if (pat.is_object() && pat.contains("String")) {
      if (!pat["String"].is_string()) throw Error(where + ".pattern.String: expected a string");
      literal_ = pat["String"].get<std::string>();
    } else if (pat.is_object() && pat.contains("Regex")) {
      if (!pat["Regex"].is_string()) throw Error(where + ".pattern.Regex: expected a string");
      regex_.emplace(pat["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else {
      throw Error(where + ".pattern: expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }
  void normalize(std::string& s) const override { s = replace_all(s); }
  bool is_noop_for(std::string_view s) const override {
    if (regex_) {
      size_t b, e;
      return s.empty() || !regex_->find(s, 0, b, e);
    }
    return literal_.empty() || s.find(literal_) == std::string_view::npos;
  }
  std::string replace_all(std::string_view s) const {
    std::string out;
    out.reserve(s.size());
    size_t pos = 0;
    if (regex_) {
      size_t from = 0, b, e;
      while (from <= s.size() && regex_->find(s, from, b, e)) {
        if (e == b) {  // an empty match replaces nothing; step over one character
          if (b >= s.size()) break;
          size_t next = b;
          utf8_next(s, next);
          from = next;
          continue;
        }
        out.append(s, pos, b - pos);
        out += content_;
        pos = from = e;
      }
    } else if (!literal_.empty()) {
      for (size_t f; (f = s.find(literal_, pos)) != std::string_view::npos; pos = f + literal_.size()) {
        out.append(s, pos, f - pos);
        out += content_;
      }
    }
    out.append(s, pos, std::string_view::npos);
    return out;
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!is_white_space(utf8_next(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_white_space(utf8_next(s, i))) break;
        e = start;
      }
    }
    s = s.substr(b, e - b);
  }
  bool is_noop_for(std::string_view s) const override {
    if (s.empty()) return true;
    size_t i = 0;
    if (left_ && is_white_space(utf8_next(s, i))) return false;
    size_t last = s.size() - 1;
    while (last > 0 && (static_cast<unsigned char>(s[last]) & 0xC0) == 0x80) --last;
    return !(right_ && is_white_space(utf8_next(s, last)));
  }

 private:
  bool left_, right_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }
  bool is_noop_for(std::string_view s) const override {
    // Later steps see earlier steps' output, so only an all-no-op chain on this input is a no-op.
    for (const auto& p : parts_)
      if (!p->is_noop_for(s)) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where, int depth) {
  if (j.is_null()) return nullptr;
  if (depth > kMaxNesting) throw Error(where + ": Sequence nested more than " + std::to_string(kMaxNesting) + " deep");
  const std::string type = require_string(j, "type", where);
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE, type);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, type);
  if (type == "NFKC")
    return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, type);
  if (type == "NFKD")
    return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, type);
  if (type == "Prepend") return std::make_unique<Prepend>(require_string(j, "prepend", where));
  if (type == "Replace") return std::make_unique<Replace>(j, where);
  if (type == "Strip")
    return std::make_unique<Strip>(get_bool(j, "strip_left", true, where), get_bool(j, "strip_right", true, where));
  if (type == "Sequence") {
    const json& list = require_field(j, "normalizers", where);
    if (!list.is_array()) throw Error(where + ".normalizers: expected an array");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = make_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", depth + 1);
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  throw Error(where + ".type: normalizer '" + type +
              "' is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence)");
}

}  // namespace ingot::tok::detail
