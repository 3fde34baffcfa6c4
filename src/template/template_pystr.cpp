// Python's str and number semantics for the chat template interpreter: the str methods templates
// call (strip, split, splitlines, replace, title, ...), int()/float() parsing of strings, round()
// and float floor division, all code-point aware and matching CPython's results, because their
// output lands in the rendered prompt. Hand-written, as the whole Jinja subset is: Debian packages
// no C++ Jinja implementation (see chat_template.h).
#include "template/template_pystr.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include <utf8proc.h>

namespace ingot::tmpl::detail {
namespace {

char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

bool is_cased(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> cps = decode_utf8(s);
  std::vector<char32_t> set;
  bool use_set = chars && !chars->is_none() && !chars->is_undefined();
  if (use_set) set = decode_utf8(chars->str());
  auto strip_it = [&](char32_t c) {
    return use_set ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return encode_utf8(cps, b, e);
}

char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }

std::string map_chars(const std::string& s, char32_t (*f)(char32_t)) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode_utf8(s)) append_utf8(out, f(c));
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::vector<char32_t> cps = decode_utf8(s);
  std::string out;
  for (std::size_t k = 0; k < cps.size(); ++k) append_utf8(out, k == 0 ? to_title(cps[k]) : to_lower(cps[k]));
  return out;
}

// str.title(): a cased character after an uncased one starts a word.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : decode_utf8(s)) {
    bool cased = is_cased(c);
    append_utf8(out, cased ? (prev_cased ? to_lower(c) : to_title(c)) : c);
    prev_cased = cased;
  }
  return out;
}

// Jinja's |title: words start after `-`, whitespace, `(`, `{`, `[` or `<`.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char32_t c : decode_utf8(s)) {
    bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
    if (sep) {
      append_utf8(out, c);
      word_start = true;
    } else {
      append_utf8(out, word_start ? to_upper(c) : to_lower(c));
      word_start = false;
    }
  }
  return out;
}

bool py_is_case(const std::string& s, bool upper) {
  bool any = false;
  for (char32_t c : decode_utf8(s)) {
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
      if (!upper) return false;
      any = true;
    } else if (cat == UTF8PROC_CATEGORY_LL) {
      if (upper) return false;
      any = true;
    }
  }
  return any;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, std::int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {
    std::vector<char32_t> cps = decode_utf8(s);
    std::vector<std::pair<std::size_t, std::size_t>> words;
    std::size_t k = 0, n = cps.size();
    if (!from_right) {
      while (k < n) {
        while (k < n && py_isspace(cps[k])) ++k;
        if (k >= n) break;
        if (maxsplit >= 0 && static_cast<std::int64_t>(words.size()) == maxsplit) {
          std::size_t e = n;
          while (e > k && py_isspace(cps[e - 1])) --e;
          words.emplace_back(k, e);
          break;
        }
        std::size_t b = k;
        while (k < n && !py_isspace(cps[k])) ++k;
        words.emplace_back(b, k);
      }
    } else {
      std::size_t e = n;
      while (e > 0) {
        while (e > 0 && py_isspace(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<std::int64_t>(words.size()) == maxsplit) {
          std::size_t b = 0;
          while (b < e && py_isspace(cps[b])) ++b;
          words.emplace_back(b, e);
          break;
        }
        std::size_t end = e;
        while (e > 0 && !py_isspace(cps[e - 1])) --e;
        words.emplace_back(e, end);
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words) parts.push_back(encode_utf8(cps, b, e));
    return parts;
  }
  const std::string& d = sep->str();
  if (d.empty()) throw std::runtime_error("split: empty separator");
  if (!from_right) {
    std::size_t start = 0;
    for (;;) {
      if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) break;
      std::size_t p = s.find(d, start);
      if (p == std::string::npos) break;
      parts.push_back(s.substr(start, p - start));
      start = p + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    std::size_t end = s.size();
    std::vector<std::string> rev;
    for (;;) {
      if (maxsplit >= 0 && static_cast<std::int64_t>(rev.size()) == maxsplit) break;
      if (end < d.size()) break;
      std::size_t p = s.rfind(d, end - d.size());
      if (p == std::string::npos) break;
      rev.push_back(s.substr(p + d.size(), end - p - d.size()));
      end = p;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  return parts;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<char32_t> cps = decode_utf8(s);
  std::vector<std::string> lines;
  std::size_t b = 0, k = 0;
  while (k < cps.size()) {
    char32_t c = cps[k];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++k;
      continue;
    }
    std::size_t eol = k + ((c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ? 2 : 1);
    lines.push_back(encode_utf8(cps, b, keepends ? eol : k));
    b = k = eol;
  }
  if (b < cps.size()) lines.push_back(encode_utf8(cps, b, cps.size()));
  return lines;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, std::int64_t count,
                       std::size_t limit) {
  std::string out;
  auto check = [&] {
    if (out.size() > limit) throw std::runtime_error("replace: result exceeds the output limit of " + std::to_string(limit) + " bytes");
  };
  if (old.empty()) {
    std::vector<char32_t> cps = decode_utf8(s);
    std::int64_t done = 0;
    for (std::size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (k < cps.size()) append_utf8(out, cps[k]);
      check();
    }
    return out;
  }
  std::size_t start = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    std::size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    check();
    start = p + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  check();
  return out;
}

// Byte offset -> code point index.
std::int64_t cp_index(const std::string& s, std::size_t byte_pos) {
  return static_cast<std::int64_t>(utf8_length(std::string_view(s).substr(0, byte_pos)));
}

bool parse_py_int(std::string_view text, std::int64_t* out) {
  std::vector<char32_t> cps = decode_utf8(text);
  std::size_t b = 0, e = cps.size();
  while (b < e && py_isspace(cps[b])) ++b;
  while (e > b && py_isspace(cps[e - 1])) --e;
  bool neg = false;
  if (b < e && (cps[b] == '+' || cps[b] == '-')) neg = cps[b++] == '-';
  if (b >= e) return false;
  std::int64_t v = 0;
  bool prev_digit = false;
  for (std::size_t k = b; k < e; ++k) {
    char32_t c = cps[k];
    if (c == '_' && prev_digit && k + 1 < e && cps[k + 1] >= '0' && cps[k + 1] <= '9') {
      prev_digit = false;
      continue;
    }
    if (c < '0' || c > '9') return false;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, static_cast<int>(c - '0'), &v))
      throw std::runtime_error("int: value out of the 64-bit range");
    prev_digit = true;
  }
  *out = neg ? -v : v;
  return true;
}

bool parse_py_float(std::string_view text, double* out) {
  std::string t = py_strip(std::string(text), nullptr, true, true);
  std::string clean;
  for (std::size_t k = 0; k < t.size(); ++k) {
    char c = t[k];
    if (c == '_') {
      if (k == 0 || k + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[k + 1])))
        return false;
      continue;
    }
    if (c == 'x' || c == 'X' || c == 'p' || c == 'P') {
      // strtod reads hex floats, which Python's float() rejects; "infinity"/"nan" have no x or p.
      return false;
    }
    clean += c;
  }
  if (clean.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return false;
  *out = v;
  return true;
}

double py_round(double x, std::int64_t ndigits) {
  if (!std::isfinite(x) || ndigits > 330) return x;
  if (ndigits < 0) throw std::runtime_error("round: negative precision is not supported");
  // printf rounds the exact binary value half-to-even, as CPython's round() does.
  std::vector<char> buf(400 + static_cast<std::size_t>(ndigits));
  std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(ndigits), x);
  return std::strtod(buf.data(), nullptr);
}

// CPython's float floor division and modulo.
void py_float_divmod(double a, double b, double* div, double* mod) {
  double m = std::fmod(a, b);
  double d = (a - m) / b;
  if (m != 0.0) {
    if ((b < 0) != (m < 0)) {
      m += b;
      d -= 1.0;
    }
  } else {
    m = std::copysign(0.0, b);
  }
  double fd;
  if (d != 0.0) {
    fd = std::floor(d);
    if (d - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, a / b);
  }
  *div = fd;
  *mod = m;
}

// Code points of a string value, as one-character string values.
List string_chars(const std::string& s) {
  List out;
  std::vector<char32_t> cps = decode_utf8(s);
  out.reserve(cps.size());
  for (char32_t c : cps) {
    std::string one;
    append_utf8(one, c);
    out.push_back(Value::string(std::move(one)));
  }
  return out;
}

}  // namespace ingot::tmpl::detail
