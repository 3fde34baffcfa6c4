// Normalizers of tokenizer.json: Unicode normalization forms (through utf8proc), Prepend, Replace,
// Strip and Sequence.
#include <utf8proc.h>

#include <cstdlib>

#include "tokenizer/components.h"

namespace ingot::tok::detail {
namespace {

bool all_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

class UnicodeForm final : public Normalizer {
 public:
  UnicodeForm(int options, std::string name) : options_(utf8proc_option_t(options)), name_(std::move(name)) {}
  void normalize(std::string& s) const override {
    if (all_ascii(s)) return;  // ASCII is invariant under every normalization form
    utf8proc_uint8_t* out = nullptr;
    // An explicit length (no NULLTERM) keeps embedded NUL characters.
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out, options_);
    if (n < 0) {
      throw Error("normalizer " + name_ + ": " + utf8proc_errmsg(n));
    }
    s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
  }
  bool is_noop_for(std::string_view s) const override { return all_ascii(s); }

 private:
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
