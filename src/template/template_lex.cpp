// Lexer of the chat template engine: turns Jinja2 source into the tokens template_parse.cpp reads.
// It mirrors Jinja2's rules as transformers configures them (trim_blocks, lstrip_blocks, no
// trailing newline kept, newlines normalised to \n) because the whitespace they keep or drop is
// part of the rendered prompt. Hand-written, as the whole Jinja subset is: Debian packages no C++
// Jinja implementation (see chat_template.h).
#include "template/template_lex.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ingot::tmpl::detail {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "template text";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "'}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "'%}'";
    case Tok::Name: return "'" + t.text + "'";
    case Tok::String: return "string literal";
    case Tok::Int:
    case Tok::Float: return "number";
    case Tok::Op: return "'" + t.text + "'";
    case Tok::Eof: return "end of template";
  }
  return "token";
}

namespace {

// Decodes one UTF-8 code point at s[pos] (the source is validated first).
char32_t code_point_at(const std::string& s, std::size_t pos, std::size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  std::size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  char32_t cp = c & (n == 4 ? 0x07 : n == 3 ? 0x0F : 0x1F);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + k]) & 0x3F);
  *len = n;
  return cp;
}

class Lexer {
 public:
  Lexer(const std::string& src, const Limits& limits) : s_(src), limits_(limits) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) {
      std::size_t start = find_tag_start(pos_);
      if (start == std::string::npos) {
        emit_data(s_.substr(pos_));
        advance_to(s_.size());
        break;
      }
      char kind = s_[start + 1];
      std::size_t after = start + 2;
      char sign = 0;
      if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
      std::size_t raw_end = 0;
      bool raw = kind == '%' && match_raw_begin(start, &raw_end);
      std::string text = s_.substr(pos_, start - pos_);
      emit_data(strip_before_tag(std::move(text), sign, kind == '{'));
      advance_to(start);
      if (raw) {
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment(after);
      } else {
        lex_tag(kind == '%', after);
      }
    }
    out_.push_back(Token{Tok::Eof, line_, ""});
    return std::move(out_);
  }

 private:
  const std::string& s_;
  const Limits& limits_;
  std::size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the previous match ended with a newline (Jinja's lstrip rule)
  std::vector<Token> out_;

  void advance_to(std::size_t p) {
    for (std::size_t k = pos_; k < p; ++k)
      if (s_[k] == '\n') ++line_;
    pos_ = p;
  }

  bool starts(std::size_t p, const char* lit) const { return s_.compare(p, std::strlen(lit), lit) == 0; }

  std::size_t skip_space(std::size_t p) const {
    while (p < s_.size()) {
      std::size_t n;
      if (!py_isspace(code_point_at(s_, p, &n))) break;
      p += n;
    }
    return p;
  }

  std::size_t find_tag_start(std::size_t from) const {
    for (std::size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1)) {
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})`
  bool match_raw_begin(std::size_t start, std::size_t* end) const {
    std::size_t p = start + 2;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
    p = skip_space(p);
    if (!starts(p, "raw")) return false;
    p = skip_space(p + 3);
    if (starts(p, "-%}")) {
      *end = skip_space(p + 3);
      return true;
    }
    if (starts(p, "%}")) {
      *end = p + 2;
      return true;
    }
    return false;
  }

  std::string rstrip_space(const std::string& text) const {
    std::vector<char32_t> cps = decode_utf8(text);
    std::size_t n = cps.size();
    while (n > 0 && py_isspace(cps[n - 1])) --n;
    return encode_utf8(cps, 0, n);
  }

  // Jinja's OptionalLStrip: `{%-` strips all whitespace before the tag; otherwise lstrip_blocks
  // removes the spaces between the line start and a block or comment tag.
  std::string strip_before_tag(std::string text, char sign, bool variable) const {
    if (sign == '-') return rstrip_space(text);
    if (sign == '+' || variable) return text;
    std::size_t nl = text.rfind('\n');
    std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos > 0 || line_starting_) {
      std::string tail = text.substr(l_pos);
      if (!tail.empty() && skip_space_in(tail) == tail.size()) text.resize(l_pos);
    }
    return text;
  }

  static std::size_t skip_space_in(const std::string& t) {
    std::size_t p = 0;
    while (p < t.size()) {
      std::size_t n;
      if (!py_isspace(code_point_at(t, p, &n))) break;
      p += n;
    }
    return p;
  }

  // Text that starts at the current position.
  void emit_data(std::string text) {
    if (!text.empty()) out_.push_back(Token{Tok::Data, line_, std::move(text)});
  }

  void lex_comment(std::size_t p) {
    int line = line_;
    for (; p < s_.size(); ++p) {
      if (starts(p, "+#}")) {
        finish_match(p + 3);
        return;
      }
      if (starts(p, "-#}")) {
        finish_match(skip_space(p + 3));
        return;
      }
      if (starts(p, "#}")) {
        std::size_t end = p + 2;
        if (end < s_.size() && s_[end] == '\n') ++end;  // trim_blocks
        finish_match(end);
        return;
      }
    }
    fail(line, "missing end of comment tag '#}'");
  }

  void finish_match(std::size_t end) {
    line_starting_ = end > 0 && s_[end - 1] == '\n';
    advance_to(end);
  }

  // The end of a `%}` at p with its whitespace control: `-%}` also takes the whitespace after it,
  // a plain `%}` one newline (trim_blocks), `+%}` nothing. 0 when no `%}` is at p.
  std::size_t block_end_at(std::size_t p) const {
    if (starts(p, "+%}")) return p + 3;
    if (starts(p, "-%}")) return skip_space(p + 3);
    if (!starts(p, "%}")) return 0;
    std::size_t end = p + 2;
    if (end < s_.size() && s_[end] == '\n') ++end;  // trim_blocks
    return end;
  }

  void lex_raw(std::size_t body_start) {
    int line = line_;
    line_starting_ = s_[body_start - 1] == '\n';
    advance_to(body_start);
    // `(.*?)({%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?))`
    for (std::size_t p = s_.find("{%", body_start); p != std::string::npos; p = s_.find("{%", p + 1)) {
      std::size_t q = p + 2;
      char sign = 0;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
      q = skip_space(q);
      if (!starts(q, "endraw")) continue;
      q = skip_space(q + 6);
      std::size_t end = block_end_at(q);
      if (!end) continue;
      emit_data(strip_before_tag(s_.substr(body_start, p - body_start), sign, false));
      finish_match(end);
      return;
    }
    fail(line, "missing '{% endraw %}'");
  }

  void lex_tag(bool block, std::size_t p) {
    int tag_line = line_;
    out_.push_back(Token{block ? Tok::BlockBegin : Tok::VarBegin, line_, ""});
    advance_to(p);
    std::vector<char> brackets;
    for (;;) {
      if (pos_ >= s_.size()) fail(tag_line, std::string("unexpected end of template inside '") + (block ? "{%" : "{{") + "'");
      if (brackets.empty()) {
        std::size_t end = 0;
        if (block) {
          end = block_end_at(pos_);
        } else {
          if (starts(pos_, "-}}"))
            end = skip_space(pos_ + 3);
          else if (starts(pos_, "}}"))
            end = pos_ + 2;
        }
        if (end) {
          out_.push_back(Token{block ? Tok::BlockEnd : Tok::VarEnd, line_, ""});
          finish_match(end);
          return;
        }
      }
      lex_token(brackets);
    }
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

  // `(\d+_)*\d+` at p; returns the end, or p when there is no digit.
  std::size_t digits(std::size_t p) const {
    if (p >= s_.size() || !is_digit(s_[p])) return p;
    std::size_t q = p;
    for (;;) {
      while (q < s_.size() && is_digit(s_[q])) ++q;
      if (q + 1 < s_.size() && s_[q] == '_' && is_digit(s_[q + 1])) {
        ++q;
        continue;
      }
      return q;
    }
  }

  static std::string without_underscores(std::string_view t) {
    std::string out;
    for (char c : t)
      if (c != '_') out += c;
    return out;
  }

  bool lex_float() {
    if (pos_ > 0 && s_[pos_ - 1] == '.') return false;  // `(?<!\.)`
    std::size_t p = digits(pos_);
    if (p == pos_) return false;
    std::size_t frac_end = 0;
    if (p < s_.size() && s_[p] == '.') {
      std::size_t q = digits(p + 1);
      if (q > p + 1) frac_end = q;
    }
    std::size_t base = frac_end ? frac_end : p;
    std::size_t end = 0;
    if (base < s_.size() && (s_[base] == 'e' || s_[base] == 'E')) {
      std::size_t q = base + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      std::size_t r = digits(q);
      if (r > q) end = r;
    }
    if (!end) end = frac_end;
    if (!end) return false;
    std::string text = without_underscores(std::string_view(s_).substr(pos_, end - pos_));
    Token t{Tok::Float, line_, text};
    t.fval = std::strtod(text.c_str(), nullptr);
    out_.push_back(std::move(t));
    advance_to(end);
    return true;
  }

  bool lex_integer() {
    char c = s_[pos_];
    if (!is_digit(c)) return false;
    int base = 10;
    std::size_t p = pos_;
    auto prefixed = [&](int b, auto ok) {
      std::size_t q = pos_ + 2;
      std::size_t last = q;
      for (;;) {
        std::size_t r = q;
        if (r < s_.size() && s_[r] == '_') ++r;
        if (r < s_.size() && ok(s_[r])) {
          q = r + 1;
          last = q;
        } else {
          break;
        }
      }
      if (last == pos_ + 2) return false;
      base = b;
      p = last;
      return true;
    };
    char x = pos_ + 1 < s_.size() ? static_cast<char>(s_[pos_ + 1] | 0x20) : 0;
    bool matched = false;
    if (c == '0' && x == 'b') matched = prefixed(2, [](char d) { return d == '0' || d == '1'; });
    if (!matched && c == '0' && x == 'o') matched = prefixed(8, [](char d) { return d >= '0' && d <= '7'; });
    if (!matched && c == '0' && x == 'x')
      matched = prefixed(16, [](char d) { return is_digit(d) || ((d | 0x20) >= 'a' && (d | 0x20) <= 'f'); });
    if (!matched) {
      p = pos_ + 1;
      char want = c == '0' ? '0' : 0;
      for (;;) {
        std::size_t r = p;
        if (r < s_.size() && s_[r] == '_') ++r;
        if (r < s_.size() && (want ? s_[r] == want : is_digit(s_[r])))
          p = r + 1;
        else
          break;
      }
    }
    std::string text = without_underscores(std::string_view(s_).substr(pos_, p - pos_));
    std::string digits_only = base == 10 ? text : text.substr(2);
    Token t{Tok::Int, line_, text};
    errno = 0;
    char* endp = nullptr;
    unsigned long long v = std::strtoull(digits_only.c_str(), &endp, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
      fail(line_, "integer literal " + text + " is out of the 64-bit range");
    t.ival = static_cast<std::int64_t>(v);
    out_.push_back(std::move(t));
    advance_to(p);
    return true;
  }

  void lex_string() {
    char quote = s_[pos_];
    std::size_t p = pos_ + 1;
    while (p < s_.size() && s_[p] != quote) p += s_[p] == '\\' ? 2 : 1;
    if (p >= s_.size()) fail(line_, std::string("unterminated string literal (missing ") + quote + ")");
    std::string value = unescape(s_.substr(pos_ + 1, p - pos_ - 1));
    out_.push_back(Token{Tok::String, line_, std::move(value)});
    advance_to(p + 1);
  }

  // Python's "unicode-escape" decoding, which Jinja applies to string literals (after turning
  // non-ASCII characters into backslash escapes, so a backslash before one stays literal).
  std::string unescape(const std::string& body) const {
    std::string out;
    for (std::size_t p = 0; p < body.size();) {
      if (body[p] != '\\') {
        out += body[p++];
        continue;
      }
      if (p + 1 >= body.size()) fail(line_, "string literal ends with a lone backslash");
      char e = body[p + 1];
      p += 2;
      auto hex = [&](std::size_t n) -> char32_t {
        if (p + n > body.size()) fail(line_, "truncated \\x/\\u/\\U escape in string literal");
        char32_t v = 0;
        for (std::size_t k = 0; k < n; ++k) {
          char d = body[p + k];
          int digit = is_digit(d) ? d - '0' : ((d | 0x20) >= 'a' && (d | 0x20) <= 'f') ? (d | 0x20) - 'a' + 10 : -1;
          if (digit < 0) fail(line_, "truncated \\x/\\u/\\U escape in string literal");
          v = v * 16 + static_cast<char32_t>(digit);
        }
        p += n;
        return v;
      };
      auto put = [&](char32_t c) {
        if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF)
          fail(line_, "string literal escape gives an invalid code point");
        append_utf8(out, c);
      };
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': put(hex(2)); break;
        case 'u': put(hex(4)); break;
        case 'U': put(hex(8)); break;
        case 'N': fail(line_, "unsupported construct '\\N{...}' escape in string literal");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < body.size() && body[p] >= '0' && body[p] <= '7'; ++k)
              v = v * 8 + static_cast<char32_t>(body[p++] - '0');
            put(v);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // `\é` reaches the decoder as `\\xe9`: a backslash, then the escape's text.
            std::size_t n;
            char32_t c = code_point_at(body, p - 1, &n);
            p += n - 1;
            append_py_escape(out, c);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  void lex_token(std::vector<char>& brackets) {
    std::size_t n;
    char32_t cp = code_point_at(s_, pos_, &n);
    if (py_isspace(cp)) {
      advance_to(skip_space(pos_));
      return;
    }
    if (lex_float() || lex_integer()) return;
    char c = s_[pos_];
    if (is_name_start(c)) {
      std::size_t p = pos_;
      while (p < s_.size() && is_name_char(s_[p])) ++p;
      if (p < s_.size() && static_cast<unsigned char>(s_[p]) >= 0x80)
        fail(line_, "unsupported construct: non-ASCII identifier");
      out_.push_back(Token{Tok::Name, line_, s_.substr(pos_, p - pos_)});
      advance_to(p);
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string();
      return;
    }
    static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (starts(pos_, op)) {
        out_.push_back(Token{Tok::Op, line_, op});
        advance_to(pos_ + 2);
        return;
      }
    }
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) && c != 0) {
      if (c == '(' || c == '[' || c == '{') {
        brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        if (brackets.size() > static_cast<std::size_t>(limits_.max_nesting))
          fail(line_, "brackets nested deeper than the limit of " + std::to_string(limits_.max_nesting));
      } else if (c == ')' || c == ']' || c == '}') {
        if (brackets.empty()) fail(line_, std::string("unexpected '") + c + "'");
        if (brackets.back() != c) fail(line_, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
        brackets.pop_back();
      }
      out_.push_back(Token{Tok::Op, line_, std::string(1, c)});
      advance_to(pos_ + 1);
      return;
    }
    std::string shown = s_.substr(pos_, n);
    fail(line_, "unexpected character '" + shown + "'");
  }
};

void check_utf8(const std::string& s) {
  int line = 1;
  for (std::size_t p = 0; p < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[p]);
    if (c == '\n') ++line;
    if (c < 0x80) {
      ++p;
      continue;
    }
    std::size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = n != 0 && p + n <= s.size();
    char32_t cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (std::size_t k = 1; ok && k < n; ++k) {
      unsigned char d = static_cast<unsigned char>(s[p + k]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF, as a strict decoder does.
    ok = ok && !(n == 2 && cp < 0x80) && !(n == 3 && cp < 0x800) && !(n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) &&
         !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) fail(line, "template is not valid UTF-8");
    p += n;
  }
}

}  // namespace

std::vector<Token> lex_template(const std::string& source, const Limits& limits) {
  if (source.size() > limits.max_source_bytes)
    throw Error("chat template is " + std::to_string(source.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_source_bytes));
  check_utf8(source);
  // Jinja treats \r\n, \r and \n alike and, with keep_trailing_newline off, drops one final newline.
  std::string src;
  src.reserve(source.size());
  for (std::size_t p = 0; p < source.size(); ++p) {
    if (source[p] == '\r') {
      src += '\n';
      if (p + 1 < source.size() && source[p + 1] == '\n') ++p;
    } else {
      src += source[p];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(src, limits).run();
}

}  // namespace ingot::tmpl::detail
