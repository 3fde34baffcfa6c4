// Lexer and parser of the chat template engine: turns Jinja2 source into the syntax tree of
// template_internal.h. The lexer mirrors Jinja2's rules as transformers configures them
// (trim_blocks, lstrip_blocks, no trailing newline kept, newlines normalised to \n) because the
// whitespace they keep or drop is part of the rendered prompt. The grammar and operator
// precedence follow Jinja2's parser; constructs outside the supported subset are rejected here
// with the line and the construct named.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "template/template_internal.h"

namespace ingot::tmpl::detail {
namespace {

[[noreturn]] void fail(int line, const std::string& msg) {
  throw Error("chat template line " + std::to_string(line) + ": " + msg);
}

enum class Tok : std::uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  int line;
  std::string text;  // data, name, decoded string, operator
  std::int64_t ival = 0;
  double fval = 0.0;
};

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
      std::size_t end;
      if (starts(q, "+%}")) {
        end = q + 3;
      } else if (starts(q, "-%}")) {
        end = skip_space(q + 3);
      } else if (starts(q, "%}")) {
        end = q + 2;
        if (end < s_.size() && s_[end] == '\n') ++end;
      } else {
        continue;
      }
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
          if (starts(pos_, "+%}")) {
            end = pos_ + 3;
          } else if (starts(pos_, "-%}")) {
            end = skip_space(pos_ + 3);
          } else if (starts(pos_, "%}")) {
            end = pos_ + 2;
            if (end < s_.size() && s_[end] == '\n') ++end;  // trim_blocks
          }
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

// ---------------------------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::vector<Token> toks, const Limits& limits) : t_(std::move(toks)), limits_(limits) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    prog->body = subparse({});
    return prog;
  }

 private:
  std::vector<Token> t_;
  const Limits& limits_;
  std::size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_nesting)
        fail(p.cur().line, "expressions or blocks nested deeper than the limit of " + std::to_string(p.limits_.max_nesting));
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur().line, std::string("expected '") + op + "', got " + describe(cur()));
  }
  void expect_type(Tok type, const char* what) {
    if (cur().type != type) fail(cur().line, std::string("expected ") + what + ", got " + describe(cur()));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(cur().line, "expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }

  static ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static StmtPtr make_stmt(StmtKind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  // --- statements -----------------------------------------------------------------------------

  // Parses until a block tag whose name is in `ends` (left as the current token) or the end.
  Body subparse(const std::vector<const char*>& ends) {
    DepthGuard guard(*this);
    Body body;
    for (;;) {
      const Token& tok = cur();
      switch (tok.type) {
        case Tok::Data: {
          auto s = make_stmt(StmtKind::Text, tok.line);
          s->text = tok.text;
          body.push_back(std::move(s));
          next();
          break;
        }
        case Tok::VarBegin: {
          int line = tok.line;
          next();
          auto s = make_stmt(StmtKind::Print, line);
          s->expr = parse_tuple(true, {}, false);
          expect_type(Tok::VarEnd, "'}}'");
          body.push_back(std::move(s));
          break;
        }
        case Tok::BlockBegin: {
          next();
          if (cur().type == Tok::Name)
            for (const char* e : ends)
              if (cur().text == e) return body;
          body.push_back(parse_statement());
          expect_type(Tok::BlockEnd, "'%}'");
          break;
        }
        case Tok::Eof:
          if (!ends.empty()) {
            std::string want;
            for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'{% " + e + " %}'";
            fail(tok.line, "unexpected end of template, expected " + want);
          }
          return body;
        default: fail(tok.line, "unexpected " + describe(tok));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& tok = cur();
    if (tok.type != Tok::Name) fail(tok.line, "expected a tag name, got " + describe(tok));
    const std::string name = tok.text;
    int line = tok.line;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(line, "'" + name + "' outside of a loop");
      next();
      return make_stmt(name == "break" ? StmtKind::Break : StmtKind::Continue, line);
    }
    if (name == "generation") {
      // transformers' AssistantTracker tag: renders its body, in a scope of its own.
      next();
      auto s = make_stmt(StmtKind::Scope, line);
      expect_type(Tok::BlockEnd, "'%}'");
      s->bodies.push_back(subparse({"endgeneration"}));
      next();
      return s;
    }
    static const char* const known_end[] = {"endif", "endfor", "endset", "endmacro", "endgeneration", "else", "elif", "endraw"};
    for (const char* e : known_end)
      if (name == e) fail(line, "unexpected '{% " + name + " %}'");
    fail(line, "unsupported construct '{% " + name + " %}'");
  }

  StmtPtr parse_if() {
    auto s = make_stmt(StmtKind::If, cur().line);
    next();
    for (;;) {
      s->conds.push_back(parse_tuple(false, {}, false));
      expect_type(Tok::BlockEnd, "'%}'");
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
      std::string which = cur().text;
      next();
      if (which == "elif") continue;
      if (which == "else") {
        expect_type(Tok::BlockEnd, "'%}'");
        s->bodies.push_back(subparse({"endif"}));
        next();
      }
      break;
    }
    return s;
  }

  Target parse_assign_target(bool with_namespace, const char* extra_end) {
    Target t;
    int line = cur().line;
    if (with_namespace && cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      t.names.push_back(expect_name());
      next();
      t.ns_attr = expect_name();
      return t;
    }
    for (;;) {
      if (cur().type != Tok::Name) fail(cur().line, "can't assign to " + describe(cur()));
      std::string n = expect_name();
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        fail(line, "can't assign to '" + n + "'");
      t.names.push_back(n);
      if (!is_op(",")) break;
      t.tuple = true;
      next();
      if (cur().type == Tok::BlockEnd || is_op("=") || (extra_end && is_name(extra_end))) break;
    }
    return t;
  }

  StmtPtr parse_for() {
    auto s = make_stmt(StmtKind::For, cur().line);
    next();
    s->target = parse_assign_target(false, "in");
    if (!skip_name("in")) fail(cur().line, "expected 'in', got " + describe(cur()));
    s->expr = parse_tuple(false, "recursive", false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail(cur().line, "unsupported construct 'recursive' loop");
    expect_type(Tok::BlockEnd, "'%}'");
    ++loop_depth_;
    s->bodies.push_back(subparse({"endfor", "else"}));
    --loop_depth_;
    std::string which = cur().text;
    next();
    if (which == "else") {
      expect_type(Tok::BlockEnd, "'%}'");
      s->bodies.push_back(subparse({"endfor"}));
      next();
    }
    return s;
  }

  StmtPtr parse_set() {
    int line = cur().line;
    next();
    Target target = parse_assign_target(true, nullptr);
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {}, false);
      return s;
    }
    if (is_op("|")) fail(cur().line, "unsupported construct 'filter on {% set %} block'");
    if (target.tuple || !target.ns_attr.empty()) fail(line, "a {% set %} block assigns to one plain name");
    auto s = make_stmt(StmtKind::SetBlock, line);
    s->target = std::move(target);
    expect_type(Tok::BlockEnd, "'%}'");
    s->bodies.push_back(subparse({"endset"}));
    next();
    return s;
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(StmtKind::Macro, cur().line);
    next();
    s->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string p = expect_name();
      if (p == "varargs" || p == "kwargs" || p == "caller")
        fail(s->line, "unsupported construct: macro parameter '" + p + "'");
      s->params.push_back(p);
      if (skip_op("=")) {
        s->defaults.push_back(parse_expression(true));
      } else if (!s->defaults.empty()) {
        fail(s->line, "non-default argument follows default argument");
      }
    }
    next();
    expect_type(Tok::BlockEnd, "'%}'");
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->bodies.push_back(subparse({"endmacro"}));
    loop_depth_ = saved;
    next();
    return s;
  }

  // --- expressions ----------------------------------------------------------------------------

  bool is_tuple_end(const char* extra) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || (cur().type == Tok::Op && cur().text == ")"))
      return true;
    return extra && cur().type == Tok::Name && cur().text == extra;
  }

  ExprPtr parse_tuple(bool with_condexpr, const char* extra_end, bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(cur().line, "expected an expression, got " + describe(cur()));
    }
    auto e = make(ExprKind::Tuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      auto e = make(ExprKind::CondExpr, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_condexpr();
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(expr1));
      if (other) e->args.push_back(std::move(other));
      expr1 = std::move(e);
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr binary(ExprKind k, int line, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = make(k, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary(ExprKind::Or, line, std::move(left), parse_and());
    return left;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary(ExprKind::And, line, std::move(left), parse_not());
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(ExprKind::Not, cur().line);
      next();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" || cur().text == "<=" ||
           cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, line);
        cmp->args.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      next();
      left = binary(ExprKind::Binary, line, std::move(left), parse_concat(), op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(ExprKind::Concat, line);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      next();
      left = binary(ExprKind::Binary, line, std::move(left), parse_pow(), op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary(ExprKind::Binary, line, std::move(left), parse_unary(true), "**");
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      ExprKind k = is_op("-") ? ExprKind::Neg : ExprKind::Pos;
      next();
      node = make(k, line);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    int line = tok.line;
    switch (tok.type) {
      case Tok::Name: {
        std::string n = tok.text;
        next();
        auto e = make(ExprKind::Const, line);
        if (n == "true" || n == "True" || n == "false" || n == "False") {
          e->constant = Value::boolean(n == "true" || n == "True");
        } else if (n == "none" || n == "None") {
          e->constant = Value::none();
        } else {
          e->kind = ExprKind::Name;
          e->name = n;
        }
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) {
          s += cur().text;
          next();
        }
        auto e = make(ExprKind::Const, line);
        e->constant = Value::string(std::move(s));
        return e;
      }
      case Tok::Int:
      case Tok::Float: {
        auto e = make(ExprKind::Const, line);
        e->constant = tok.type == Tok::Int ? Value::integer(tok.ival) : Value::number(tok.fval);
        next();
        return e;
      }
      case Tok::Op:
        if (tok.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          next();
          auto e = make(ExprKind::List, line);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        if (tok.text == "{") {
          next();
          auto e = make(ExprKind::Dict, line);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    fail(line, "unexpected " + describe(tok));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      if (is_op(".")) {
        int line = cur().line;
        next();
        if (cur().type == Tok::Name) {
          auto e = make(ExprKind::GetAttr, line);
          e->name = cur().text;
          next();
          e->args.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().type == Tok::Int) {
          auto e = make(ExprKind::GetItem, line);
          auto k = make(ExprKind::Const, line);
          k->constant = Value::integer(cur().ival);
          next();
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(k));
          node = std::move(e);
        } else {
          fail(line, "expected a name or number after '.'");
        }
      } else if (is_op("[")) {
        int line = cur().line;
        next();
        std::vector<ExprPtr> subs;
        while (!is_op("]")) {
          if (!subs.empty()) expect_op(",");
          subs.push_back(parse_subscribed());
        }
        next();
        auto e = make(ExprKind::GetItem, line);
        e->args.push_back(std::move(node));
        if (subs.size() == 1) {
          e->args.push_back(std::move(subs[0]));
        } else {
          auto tup = make(ExprKind::Tuple, line);
          tup->args = std::move(subs);
          e->args.push_back(std::move(tup));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // `a`, or a slice `a:b:c` with any part left out (a missing part is a null pointer in args).
  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();
    auto e = make(ExprKind::Slice, line);
    e->args.push_back(std::move(start));
    if (!is_op(":") && !is_op("]") && !is_op(","))
      e->args.push_back(parse_expression(true));
    else
      e->args.push_back(nullptr);
    if (skip_op(":") && !is_op("]") && !is_op(","))
      e->args.push_back(parse_expression(true));
    else
      e->args.push_back(nullptr);
    return e;
  }

  // Fills args (after any already there) and kwnames from `( ... )`.
  void parse_call_args(Expr& e) {
    int line = cur().line;
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail(line, "unsupported construct '*args/**kwargs' in a call");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        e.kwnames.push_back(cur().text);
        next();
        next();
        e.args.push_back(parse_expression(true));
      } else {
        if (!e.kwnames.empty()) fail(line, "positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
      need_comma = true;
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprKind::Call, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      if (is_op("|")) {
        next();
        int line = cur().line;
        std::string name = expect_name();
        if (is_op(".")) fail(line, "unsupported construct: dotted filter name '" + name + ".'");
        if (!is_known_filter(name)) fail(line, "unsupported construct: filter '" + name + "'");
        auto e = make(ExprKind::Filter, line);
        e->name = name;
        e->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        int line = cur().line;
        next();
        bool negated = skip_name("not");
        std::string name = expect_name();
        if (is_op(".")) fail(line, "unsupported construct: dotted test name '" + name + ".'");
        if (!is_known_test(name)) fail(line, "unsupported construct: test '" + name + "'");
        auto e = make(ExprKind::Test, line);
        e->name = name;
        e->negated = negated;
        e->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur().line, "you cannot chain multiple tests with 'is'");
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Scope analysis. Jinja compiles each scope (the template, a loop body, a macro, ...) with a
// symbol table built in source order: a name whose first use in a scope is an assignment, with no
// enclosing scope using it, starts out undefined in that scope, even if the caller passed a
// variable of that name. So `{% for m in messages %}{{ x }}{% endfor %}{% set x = 1 %}` prints
// nothing for x inside the loop. The interpreter otherwise looks names up through the chain of
// scopes, which agrees with Jinja in every other case; this pass finds the exceptions.

class ScopeAnalysis {
 public:
  void run(Program& prog) {
    Symbols root(nullptr);
    for (auto& st : prog.body) visit(*st, root);
    prog.undefined_on_entry = root.undefined_names();
    for (auto& st : prog.body) analyze_children(*st, root);
  }

 private:
  enum class Kind : std::uint8_t { Resolve, Undefined, Alias, Param };
  struct Symbols {
    const Symbols* parent;
    std::vector<std::pair<std::string, Kind>> refs;
    std::vector<std::string> stores;
    explicit Symbols(const Symbols* p) : parent(p) {}
    Kind* own(const std::string& n) {
      for (auto& [k, v] : refs)
        if (k == n) return &v;
      return nullptr;
    }
    bool has_own(const std::string& n) const {
      for (const auto& [k, v] : refs)
        if (k == n) return true;
      return false;
    }
    bool find_ref(const std::string& n) const {
      for (const Symbols* s = this; s; s = s->parent)
        if (s->has_own(n)) return true;
      return false;
    }
    bool stored(const std::string& n) const { return std::find(stores.begin(), stores.end(), n) != stores.end(); }
    void set(const std::string& n, Kind k) {
      if (Kind* o = own(n))
        *o = k;
      else
        refs.emplace_back(n, k);
    }
    void load(const std::string& n) {
      if (!find_ref(n)) set(n, Kind::Resolve);
    }
    void store(const std::string& n) {
      if (!stored(n)) stores.push_back(n);
      if (has_own(n)) return;
      set(n, parent && parent->find_ref(n) ? Kind::Alias : Kind::Undefined);
    }
    void param(const std::string& n) {
      if (!stored(n)) stores.push_back(n);
      set(n, Kind::Param);
    }
    // A name first assigned inside a branch of an `if` keeps the value from outside until then.
    void branch_update(const std::vector<Symbols>& branches) {
      std::vector<std::string> branch_stores;
      for (const auto& b : branches)
        for (const auto& t : b.stores)
          if (!stored(t) && std::find(branch_stores.begin(), branch_stores.end(), t) == branch_stores.end())
            branch_stores.push_back(t);
      for (const auto& b : branches) {
        for (const auto& [k, v] : b.refs) set(k, v);
        for (const auto& t : b.stores)
          if (!stored(t)) stores.push_back(t);
      }
      for (const auto& n : branch_stores) set(n, parent && parent->find_ref(n) ? Kind::Alias : Kind::Resolve);
    }
    std::vector<std::string> undefined_names() const {
      std::vector<std::string> out;
      for (const auto& [k, v] : refs)
        if (v == Kind::Undefined) out.push_back(k);
      return out;
    }
  };

  void visit_expr(const Expr* e, Symbols& s) {
    if (!e) return;
    if (e->kind == ExprKind::Name) s.load(e->name);
    for (const auto& a : e->args) visit_expr(a.get(), s);
  }

  // One `if` node as Jinja sees it: test, body, its elif nodes, else body.
  void visit_if(const Stmt& st, std::size_t k, Symbols& s, bool with_rest) {
    visit_expr(st.conds[k].get(), s);
    std::vector<Symbols> branches(3, s);
    for (const auto& b : st.bodies[k]) visit(*b, branches[0]);
    if (with_rest) {
      for (std::size_t j = k + 1; j < st.conds.size(); ++j) visit_if(st, j, branches[1], false);
      if (st.bodies.size() > st.conds.size())
        for (const auto& b : st.bodies.back()) visit(*b, branches[2]);
    }
    s.branch_update(branches);
  }

  // Symbols of one scope, not descending into nested scopes.
  void visit(const Stmt& st, Symbols& s) {
    switch (st.kind) {
      case StmtKind::Print: visit_expr(st.expr.get(), s); break;
      case StmtKind::If: visit_if(st, 0, s, true); break;
      case StmtKind::For: visit_expr(st.expr.get(), s); break;
      case StmtKind::Set:
        visit_expr(st.expr.get(), s);
        if (!st.target.ns_attr.empty()) {
          s.load(st.target.names[0]);
        } else {
          for (const auto& n : st.target.names) s.store(n);
        }
        break;
      case StmtKind::SetBlock: s.store(st.target.names[0]); break;
      case StmtKind::Macro: s.store(st.text); break;
      default: break;
    }
  }

  Symbols analyze_body(const Body& body, const Symbols& parent, const std::vector<std::string>& params,
                       const std::vector<ExprPtr>* defaults) {
    Symbols s(&parent);
    for (const auto& p : params) s.param(p);
    if (defaults)
      for (const auto& d : *defaults) visit_expr(d.get(), s);
    for (const auto& b : body) visit(*b, s);
    return s;
  }

  // Analyses the scopes nested in st (whose enclosing scope has the symbols `outer`).
  void analyze_children(Stmt& st, const Symbols& outer) {
    switch (st.kind) {
      case StmtKind::If:
        for (auto& body : st.bodies)
          for (auto& b : body) analyze_children(*b, outer);
        return;
      case StmtKind::For:
      case StmtKind::Macro:
      case StmtKind::SetBlock:
      case StmtKind::Scope: break;
      default: return;
    }
    st.undefined_on_entry.clear();
    for (std::size_t k = 0; k < st.bodies.size(); ++k) {
      std::vector<std::string> params;
      if (st.kind == StmtKind::For && k == 0) params = st.target.names;
      if (st.kind == StmtKind::Macro) params = st.params;
      Symbols s = analyze_body(st.bodies[k], outer, params, st.kind == StmtKind::Macro ? &st.defaults : nullptr);
      st.undefined_on_entry.push_back(s.undefined_names());
      for (auto& b : st.bodies[k]) analyze_children(*b, s);
    }
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

std::unique_ptr<Program> parse_template(const std::string& source, const Limits& limits) {
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
  Lexer lexer(src, limits);
  Parser parser(lexer.run(), limits);
  std::unique_ptr<Program> prog = parser.run();
  ScopeAnalysis().run(*prog);
  return prog;
}

}  // namespace ingot::tmpl::detail
