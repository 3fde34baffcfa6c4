// UTF-8 helpers, the PCRE2 wrapper and JSON field helpers used across the tokenizer (see internal.h).
#include "tokenizer/internal.h"

#include <cstring>
#include <vector>

#include <pcre2.h>
#include <utf8proc.h>

namespace ingot::tok::detail {

// ---------------------------------------------------------------------------------------------
// UTF-8

Utf8Step utf8_step(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, true, false};
  uint32_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 == 0xE0) {
    need = 3, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 3;
  } else if (b0 == 0xED) {
    need = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 4, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 4;
  } else if (b0 == 0xF4) {
    need = 4, hi = 0x8F;
  } else {
    return {1, false, false};
  }
  for (uint32_t k = 1; k < need; ++k) {
    if (k >= n) return {k, false, true};
    const unsigned char c = p[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return {k, false, false};
  }
  return {need, true, false};
}

bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    // ASCII runs are the common case; skip them eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(p + i, n - i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    const Utf8Step st = utf8_step(p + i, n - i);
    if (st.valid) {
      out.append(s.data() + i, st.len);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += st.len;
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  // A character is at most 4 bytes, so an unfinished one starts within the last 3.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    if ((p[start] & 0xC0) == 0x80) continue;  // continuation byte: its lead is further back
    const Utf8Step st = utf8_step(p + start, back);
    return st.truncated ? back : 0;
  }
  return 0;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char b0 = p[i];
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t cp = ((b0 & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    char32_t cp = ((b0 & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
    return cp;
  }
  char32_t cp = ((b0 & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) |
                (p[i + 3] & 0x3F);
  i += 4;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Regex

std::string translate_oniguruma(const std::string& pat, const std::string& where) {
  // Oniguruma's \s is exactly the White_Space property; PCRE2's UCP \s also takes U+180E.
  // Oniguruma's \w takes marks and connector punctuation, PCRE2's only letters, digits and _.
  // Oniguruma (Ruby syntax) reads \h as a hex digit; PCRE2 as horizontal space.
  static constexpr const char* kWord = "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}";
  std::string out;
  out.reserve(pat.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char e = pat[i + 1];
      ++i;
      const bool in_class = class_depth > 0;
      switch (e) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'w': out += in_class ? std::string(kWord) : "[" + std::string(kWord) + "]"; break;
        case 'W':
          if (in_class)
            throw Error(where + ": \\W inside a character class is not supported in regex '" + pat + "'");
          out += "[^" + std::string(kWord) + "]";
          break;
        case 'h': out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
        case 'H':
          if (in_class)
            throw Error(where + ": \\H inside a character class is not supported in regex '" + pat + "'");
          out += "[^0-9a-fA-F]";
          break;
        default:
          out += c;
          out += e;
      }
      continue;
    }
    if (c == '[') {
      // "[:alpha:]" inside a class is a POSIX class, not a nested class.
      if (class_depth > 0 && i + 1 < pat.size() && pat[i + 1] == ':') {
        const size_t close = pat.find(":]", i + 2);
        if (close != std::string::npos) {
          out.append(pat, i, close + 2 - i);
          i = close + 1;
          continue;
        }
      }
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {
// One match-data block per thread, reused by every match: allocation per piece would cost more
// than matching short words.
struct ThreadMatchData {
  pcre2_match_data* md = pcre2_match_data_create(16, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(md); }
};
pcre2_match_data* thread_match_data() {
  thread_local ThreadMatchData tmd;
  if (!tmd.md) throw Error("regex: out of memory allocating PCRE2 match data");
  return tmd.md;
}
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) {
  const std::string translated = translate_oniguruma(pattern, where);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &err, &off, nullptr);
  if (!code) {
    throw Error(where + ": cannot compile regex '" + pattern + "': " + pcre2_message(err) +
                " at offset " + std::to_string(off));
  }
  code_ = std::make_shared<Code>();
  code_->code = code;
  code_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

bool Regex::find(std::string_view subject, size_t from, size_t& mb, size_t& me) const {
  pcre2_match_data* md = thread_match_data();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (code_->jit) {
    rc = pcre2_jit_match(code_->code, s, subject.size(), from, 0, md, nullptr);
    // The JIT stack can run out on pathological input; the interpreter has no such limit.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_->code, s, subject.size(), from, PCRE2_NO_UTF_CHECK, md, nullptr);
  } else {
    rc = pcre2_match(code_->code, s, subject.size(), from, PCRE2_NO_UTF_CHECK, md, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error("regex: matching failed: " + pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  mb = ov[0];
  me = ov[1];
  return true;
}

// ---------------------------------------------------------------------------------------------
// JSON helpers

std::string json_type_name(const json& j) { return j.type_name(); }

const json& require_field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) throw Error(where + ": expected an object, found " + json_type_name(obj));
  auto it = obj.find(key);
  if (it == obj.end()) throw Error(where + ": missing field '" + key + "'");
  return *it;
}

std::string require_string(const json& obj, const char* key, const std::string& where) {
  const json& v = require_field(obj, key, where);
  if (!v.is_string())
    throw Error(where + "." + key + ": expected a string, found " + json_type_name(v));
  return v.get<std::string>();
}

bool get_bool(const json& obj, const char* key, bool fallback, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    throw Error(where + "." + key + ": expected true or false, found " + json_type_name(*it));
  return it->get<bool>();
}

bool get_optional_string(const json& obj, const char* key, std::string& out, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return false;
  if (!it->is_string())
    throw Error(where + "." + key + ": expected a string or null, found " + json_type_name(*it));
  out = it->get<std::string>();
  return true;
}

}  // namespace ingot::tok::detail
