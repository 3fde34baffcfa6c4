// Interpreter of the chat template engine: walks the syntax tree of template_parse.cpp over the
// values of template_value.cpp with Jinja2's semantics (scoping, loops, macros, attribute lookup,
// filters, tests, the Python methods templates call on strings, dicts and lists) and enforces
// the sandbox limits. Hand-written; see chat_template.h for why.
#include "template/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <stdexcept>

#include <utf8proc.h>

#include "core/error.h"
#include "template/template_internal.h"

namespace ingot::tmpl {
namespace detail {

struct Frame;

struct Callable {
  enum class Kind : std::uint8_t { Macro, Method, Global, Cycle };
  Kind kind;
  std::string name;
  Value self;                  // Method: the bound object; Cycle: the loop's index0
  const Stmt* macro = nullptr;
  std::weak_ptr<Frame> closure;  // weak: a frame holding the macro must not keep itself alive
};

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  const Value* find(std::string_view name) const {
    for (const Frame* f = this; f; f = f->parent.get())
      for (const auto& [k, v] : f->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};
using FramePtr = std::shared_ptr<Frame>;

namespace {

const char* const kFilters[] = {"tojson", "trim", "length", "count", "string", "lower", "upper", "first", "last",
                                "join", "replace", "default", "d", "items", "list", "selectattr", "rejectattr",
                                "select", "reject", "map", "safe", "capitalize", "title", "int", "float", "round",
                                "abs", "sort", "unique", "reverse", "max", "min", "sum", "dictsort", "center",
                                "indent"};
const char* const kTests[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
                              "number", "string", "mapping", "iterable", "sequence", "callable", "in", "even",
                              "odd", "divisibleby", "eq", "equalto", "ne", "lt", "lessthan", "le", "gt",
                              "greaterthan", "ge", "lower", "upper"};

// Attribute names Python types really have: on a dict they shadow keys of the same name
// (`message.items` is the method), as in Jinja. Names here but not implemented fail when called.
const char* const kStrMethods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
    "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower",
    "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
    "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase",
    "title", "translate", "upper", "zfill"};
const char* const kDictMethods[] = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                    "pop", "popitem", "setdefault", "update", "values"};
const char* const kListMethods[] = {"append", "clear", "copy", "count", "extend", "index",
                                    "insert", "pop", "remove", "reverse", "sort"};
const char* const kTupleMethods[] = {"count", "index"};

template <std::size_t N>
bool in_table(const char* const (&table)[N], std::string_view name) {
  for (const char* t : table)
    if (name == t) return true;
  return false;
}

constexpr int kMaxValueDepth = 1000;

enum class Flow : std::uint8_t { Normal, Break, Continue };

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(std::size_t index, std::string_view name) const {
    if (index < pos.size()) return &pos[index];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

// --- string helpers (code-point aware, Python semantics) ---------------------------------------

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
char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

bool is_cased(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

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

bool contains_namespace(const Value& v, int depth) {
  if (depth > kMaxValueDepth) throw std::runtime_error("value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  if (v.type == Type::Namespace) return true;
  if (v.type == Type::List)
    for (const Value& e : *v.list)
      if (contains_namespace(e, depth + 1)) return true;
  if (v.type == Type::Dict)
    for (const auto& [k, e] : v.dict->entries)
      if (contains_namespace(e, depth + 1)) return true;
  if (v.type == Type::Function && v.fn->kind == Callable::Kind::Method) return contains_namespace(v.fn->self, depth + 1);
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

class Interp {
 public:
  Interp(const Limits& limits, std::string* out) : lim_(limits), out_(out) {}

  void run(const Program& prog, const FramePtr& root) {
    try {
      mark_undefined(*root, prog.undefined_on_entry);
      exec_body(prog.body, root);
    } catch (const Error&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw Error("chat template line " + std::to_string(line_) + ": out of memory");
    } catch (const std::exception& e) {
      throw Error("chat template line " + std::to_string(line_) + ": " + e.what());
    }
  }

 private:
  const Limits& lim_;
  std::string* out_;
  int line_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t iterations_ = 0;
  int call_depth_ = 0;

  [[noreturn]] void fail(int line, const std::string& msg) const {
    throw Error("chat template line " + std::to_string(line) + ": " + msg);
  }

  void step(int line) {
    line_ = line;
    if (++steps_ > lim_.max_steps)
      fail(line, "template exceeded the limit of " + std::to_string(lim_.max_steps) + " evaluation steps");
  }

  void check_len(std::size_t n, int line) const {
    if (n > lim_.max_output_bytes)
      fail(line, "a string of " + std::to_string(n) + " bytes exceeds the output limit of " +
                     std::to_string(lim_.max_output_bytes) + " bytes");
  }
  void check_count(std::size_t n, int line) const {
    if (n > lim_.max_loop_iterations)
      fail(line, "a sequence of " + std::to_string(n) + " items exceeds the limit of " +
                     std::to_string(lim_.max_loop_iterations) + " items");
  }

  Value str_value(std::string s, int line) const {
    check_len(s.size(), line);
    return Value::string(std::move(s));
  }

  // Python str(v), bounded by the output limit.
  std::string text_of(const Value& v) const { return to_str(v, lim_.max_output_bytes); }

  void emit(const std::string& s, int line) {
    out_->append(s);
    check_len(out_->size(), line);
  }

  [[noreturn]] void undefined_error(const Value& v, int line) const { fail(line, "UndefinedError: " + v.str()); }

  static void mark_undefined(Frame& f, const std::vector<std::string>& names) {
    for (const auto& n : names) f.set(n, Value::undefined("'" + n + "' is undefined"));
  }

  static FramePtr child_frame(const FramePtr& parent, const Stmt& s, std::size_t body) {
    auto frame = std::make_shared<Frame>(Frame{{}, parent});
    if (body < s.undefined_on_entry.size()) mark_undefined(*frame, s.undefined_on_entry[body]);
    return frame;
  }

  // --- statements -----------------------------------------------------------------------------

  Flow exec_body(const Body& body, const FramePtr& f) {
    for (const auto& s : body) {
      Flow fl = exec(*s, f);
      if (fl != Flow::Normal) return fl;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, const FramePtr& f) {
    step(s.line);
    switch (s.kind) {
      case StmtKind::Text: emit(s.text, s.line); return Flow::Normal;
      case StmtKind::Print: {
        Value v = eval(*s.expr, f);
        line_ = s.line;
        emit(text_of(v), s.line);
        return Flow::Normal;
      }
      case StmtKind::If:
        for (std::size_t k = 0; k < s.bodies.size(); ++k) {
          if (k < s.conds.size() && !truthy(eval(*s.conds[k], f))) continue;
          return exec_body(s.bodies[k], f);
        }
        return Flow::Normal;
      case StmtKind::For: return exec_for(s, f);
      case StmtKind::Set: assign(s.target, eval(*s.expr, f), f, s.line); return Flow::Normal;
      case StmtKind::SetBlock: {
        std::string captured = capture(s.bodies[0], child_frame(f, s, 0));
        f->set(s.target.names[0], Value::string(std::move(captured)));
        return Flow::Normal;
      }
      case StmtKind::Macro: {
        auto c = std::make_shared<Callable>();
        c->kind = Callable::Kind::Macro;
        c->name = s.text;
        c->macro = &s;
        c->closure = f;
        Value v;
        v.type = Type::Function;
        v.fn = std::move(c);
        f->set(s.text, std::move(v));
        return Flow::Normal;
      }
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Scope: exec_body(s.bodies[0], child_frame(f, s, 0)); return Flow::Normal;
    }
    fail(s.line, "unsupported statement");
  }

  std::string capture(const Body& body, const FramePtr& f) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      exec_body(body, f);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  void assign(const Target& t, Value v, const FramePtr& f, int line) {
    if (!t.ns_attr.empty()) {
      const Value* ns = f->find(t.names[0]);
      if (!ns || ns->type != Type::Namespace) fail(line, "cannot assign attribute on non-namespace object '" + t.names[0] + "'");
      if (contains_namespace(v, 0)) fail(line, "storing a namespace inside a namespace is not supported");
      ns->dict->set(t.ns_attr, std::move(v));
      return;
    }
    if (!t.tuple) {
      f->set(t.names[0], std::move(v));
      return;
    }
    List items = iterate(v, line);
    if (items.size() != t.names.size())
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(t.names.size()) + " names");
    for (std::size_t k = 0; k < items.size(); ++k) f->set(t.names[k], std::move(items[k]));
  }

  Flow exec_for(const Stmt& s, const FramePtr& f) {
    List items = iterate(eval(*s.expr, f), s.line);
    if (s.cond) {
      List kept;
      for (Value& item : items) {
        count_iteration(s.line);
        auto probe = std::make_shared<Frame>(Frame{{}, f});
        assign(s.target, item, probe, s.line);
        if (truthy(eval(*s.cond, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const std::size_t n = items.size();
    for (std::size_t k = 0; k < n; ++k) {
      count_iteration(s.line);
      FramePtr frame = child_frame(f, s, 0);
      auto loop = std::make_shared<Dict>();
      auto idx = static_cast<std::int64_t>(k);
      auto len = static_cast<std::int64_t>(n);
      loop->set("index", Value::integer(idx + 1));
      loop->set("index0", Value::integer(idx));
      loop->set("revindex", Value::integer(len - idx));
      loop->set("revindex0", Value::integer(len - idx - 1));
      loop->set("first", Value::boolean(k == 0));
      loop->set("last", Value::boolean(k + 1 == n));
      loop->set("length", Value::integer(len));
      loop->set("depth", Value::integer(1));
      loop->set("depth0", Value::integer(0));
      if (k > 0) loop->set("previtem", items[k - 1]);
      if (k + 1 < n) loop->set("nextitem", items[k + 1]);
      auto cycle = std::make_shared<Callable>();
      cycle->kind = Callable::Kind::Cycle;
      cycle->name = "loop.cycle";
      cycle->self = Value::integer(idx);
      Value cv;
      cv.type = Type::Function;
      cv.fn = std::move(cycle);
      loop->set("cycle", std::move(cv));
      frame->set("loop", Value::mapping(std::move(loop)));
      assign(s.target, items[k], frame, s.line);
      if (exec_body(s.bodies[0], frame) == Flow::Break) break;
    }
    if (n == 0 && s.bodies.size() > 1) exec_body(s.bodies[1], child_frame(f, s, 1));
    return Flow::Normal;
  }

  void count_iteration(int line) {
    if (++iterations_ > lim_.max_loop_iterations)
      fail(line, "template exceeded the limit of " + std::to_string(lim_.max_loop_iterations) + " loop iterations");
  }

  // Python iter(): the items a for loop, list(), join() and friends see.
  List iterate(const Value& v, int line) const {
    switch (v.type) {
      case Type::Undefined: return {};
      case Type::List: return *v.list;
      case Type::String: return string_chars(v.str());
      case Type::Dict: {
        List keys;
        for (const auto& [k, e] : v.dict->entries) keys.push_back(Value::string(k));
        return keys;
      }
      default: fail(line, std::string("TypeError: '") + type_name(v) + "' object is not iterable");
    }
  }

  // --- expressions ----------------------------------------------------------------------------

  Value eval(const Expr& e, const FramePtr& f) {
    step(e.line);
    switch (e.kind) {
      case ExprKind::Const: return e.constant;
      case ExprKind::Name: return lookup(e.name, f);
      case ExprKind::List:
      case ExprKind::Tuple: {
        List items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, f));
        return Value::sequence(std::move(items), e.kind == ExprKind::Tuple ? SeqKind::Tuple : SeqKind::List);
      }
      case ExprKind::Dict: {
        auto d = std::make_shared<Dict>();
        for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], f);
          if (!key.is_string()) fail(e.line, "unsupported construct: dict literal with a non-string key");
          d->set(key.str(), eval(*e.args[k + 1], f));
        }
        return Value::mapping(std::move(d));
      }
      case ExprKind::GetAttr: {
        Value obj = eval(*e.args[0], f);
        return get_attr(obj, e.name, e.line);
      }
      case ExprKind::GetItem: {
        Value obj = eval(*e.args[0], f);
        if (e.args[1]->kind == ExprKind::Slice) return slice(obj, *e.args[1], f);
        Value key = eval(*e.args[1], f);
        return get_item(obj, key, e.line);
      }
      case ExprKind::Slice: fail(e.line, "a slice is only valid inside []");
      case ExprKind::Call: return call(e, f);
      case ExprKind::Filter: {
        Value subject = eval(*e.args[0], f);
        Args args = eval_args(e, f);
        return apply_filter(e.name, subject, args, e.line);
      }
      case ExprKind::Test: {
        Value subject = eval(*e.args[0], f);
        Args args = eval_args(e, f);
        bool r = apply_test(e.name, subject, args, e.line);
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprKind::Neg:
      case ExprKind::Pos: {
        Value v = eval(*e.args[0], f);
        if (v.is_undefined()) undefined_error(v, e.line);
        if (v.type == Type::Float) return Value::number(e.kind == ExprKind::Neg ? -v.f : v.f);
        if (v.is_integral()) {
          std::int64_t x = v.as_int();
          if (e.kind == ExprKind::Pos) return Value::integer(x);
          if (x == INT64_MIN) fail(e.line, "integer overflow");
          return Value::integer(-x);
        }
        fail(e.line, std::string("TypeError: bad operand type for unary ") + (e.kind == ExprKind::Neg ? "-" : "+") +
                         ": '" + type_name(v) + "'");
      }
      case ExprKind::Not: return Value::boolean(!truthy(eval(*e.args[0], f)));
      case ExprKind::And: {
        Value a = eval(*e.args[0], f);
        return truthy(a) ? eval(*e.args[1], f) : a;
      }
      case ExprKind::Or: {
        Value a = eval(*e.args[0], f);
        return truthy(a) ? a : eval(*e.args[1], f);
      }
      case ExprKind::CondExpr:
        if (truthy(eval(*e.args[0], f))) return eval(*e.args[1], f);
        if (e.args.size() > 2) return eval(*e.args[2], f);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      case ExprKind::Concat: {
        std::string s;
        for (const auto& a : e.args) {
          Value v = eval(*a, f);
          s += text_of(v);
          check_len(s.size(), e.line);
        }
        return Value::string(std::move(s));
      }
      case ExprKind::Binary: {
        Value a = eval(*e.args[0], f);
        Value b = eval(*e.args[1], f);
        return binary(e.name, a, b, e.line);
      }
      case ExprKind::Compare: {
        Value left = eval(*e.args[0], f);
        for (std::size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], f);
          if (!compare(e.ops[k], left, right, e.line)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
    }
    fail(e.line, "unsupported expression");
  }

  Value lookup(const std::string& name, const FramePtr& f) const {
    if (const Value* v = f->find(name)) return *v;
    static const char* const globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};
    for (const char* g : globals) {
      if (name == g) {
        auto c = std::make_shared<Callable>();
        c->kind = Callable::Kind::Global;
        c->name = name;
        Value v;
        v.type = Type::Function;
        v.fn = std::move(c);
        return v;
      }
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  Args eval_args(const Expr& e, const FramePtr& f) {
    Args a;
    std::size_t n_kw = e.kwnames.size();
    std::size_t n_pos = e.args.size() - 1 - n_kw;
    for (std::size_t k = 0; k < n_pos; ++k) a.pos.push_back(eval(*e.args[1 + k], f));
    for (std::size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kwnames[k], eval(*e.args[1 + n_pos + k], f));
    return a;
  }

  static Value method_value(const Value& self, const std::string& name) {
    auto c = std::make_shared<Callable>();
    c->kind = Callable::Kind::Method;
    c->name = name;
    c->self = self;
    Value v;
    v.type = Type::Function;
    v.fn = std::move(c);
    return v;
  }

  // The Python attribute `name` of v, if its type has one.
  static bool python_attr(const Value& v, const std::string& name, Value* out) {
    bool has = false;
    switch (v.type) {
      case Type::String: has = in_table(kStrMethods, name); break;
      case Type::Dict: has = in_table(kDictMethods, name); break;
      case Type::List:
        has = v.seq == SeqKind::List ? in_table(kListMethods, name) : v.seq == SeqKind::Tuple && in_table(kTupleMethods, name);
        break;
      default: break;
    }
    if (has) *out = method_value(v, name);
    return has;
  }

  static std::string object_name(const Value& v) { return std::string(type_name(v)) + " object"; }

  // Jinja's sandboxed getattr: the Python attribute first, then the item of that name.
  Value get_attr(const Value& obj, const std::string& name, int line) const {
    if (obj.is_undefined()) undefined_error(obj, line);
    Value m;
    if (python_attr(obj, name, &m)) return m;
    if (obj.type == Type::Dict || obj.type == Type::Namespace) {
      if (const Value* v = obj.dict->find(name)) return *v;
    }
    return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
  }

  // Jinja's getitem: the item first, then (for a string key) the attribute.
  Value get_item(const Value& obj, const Value& key, int line) const {
    if (obj.is_undefined()) undefined_error(obj, line);
    if (obj.type == Type::Dict || obj.type == Type::Namespace) {
      if (key.is_string()) {
        if (obj.type == Type::Dict)
          if (const Value* v = obj.dict->find(key.str())) return *v;
        return get_attr(obj, key.str(), line);
      }
    } else if ((obj.type == Type::List && (obj.seq == SeqKind::List || obj.seq == SeqKind::Tuple)) || obj.is_string()) {
      if (key.is_integral()) {
        std::int64_t k = key.as_int();
        if (obj.is_string()) {
          std::vector<char32_t> cps = decode_utf8(obj.str());
          auto n = static_cast<std::int64_t>(cps.size());
          if (k < 0) k += n;
          if (k >= 0 && k < n) return Value::string(encode_utf8(cps, k, k + 1));
          return Value::undefined("'str object' has no element " + std::to_string(key.as_int()));
        }
        auto n = static_cast<std::int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k >= 0 && k < n) return (*obj.list)[static_cast<std::size_t>(k)];
        return Value::undefined(std::string(type_name(obj)) + " object has no element " + std::to_string(key.as_int()));
      }
      if (key.is_string()) return get_attr(obj, key.str(), line);
    } else if (key.is_string()) {
      return get_attr(obj, key.str(), line);
    }
    return Value::undefined("'" + object_name(obj) + "' has no element " + (key.is_string() || key.is_number() ? text_of(key) : std::string(type_name(key))));
  }

  std::int64_t slice_bound(const Expr* e, const FramePtr& f, bool* given) {
    *given = false;
    if (!e) return 0;
    Value v = eval(*e, f);
    if (v.is_none()) return 0;
    if (!v.is_integral()) fail(e->line, "TypeError: slice indices must be integers or None");
    *given = true;
    return v.as_int();
  }

  Value slice(const Value& obj, const Expr& sl, const FramePtr& f) {
    bool has_start, has_stop, has_step;
    std::int64_t start = slice_bound(sl.args[0].get(), f, &has_start);
    std::int64_t stop = slice_bound(sl.args[1].get(), f, &has_stop);
    std::int64_t stepv = slice_bound(sl.args[2].get(), f, &has_step);
    if (!has_step) stepv = 1;
    if (stepv == 0) fail(sl.line, "ValueError: slice step cannot be zero");
    if (obj.is_undefined()) undefined_error(obj, sl.line);
    bool is_str = obj.is_string();
    bool is_seq = obj.type == Type::List && (obj.seq == SeqKind::List || obj.seq == SeqKind::Tuple);
    // Jinja compiles a slice to a plain Python subscript, bypassing its lenient getitem.
    if (obj.type == Type::Dict) fail(sl.line, "TypeError: unhashable type: 'slice'");
    if (!is_str && !is_seq) fail(sl.line, std::string("TypeError: '") + type_name(obj) + "' object is not subscriptable");
    std::vector<char32_t> cps;
    if (is_str) cps = decode_utf8(obj.str());
    auto n = static_cast<std::int64_t>(is_str ? cps.size() : obj.list->size());
    // CPython's PySlice_AdjustIndices.
    auto adjust = [&](std::int64_t v, bool given, bool is_start) {
      if (!given) return stepv > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
      if (v < 0) {
        v += n;
        if (v < 0) v = stepv < 0 ? -1 : 0;
      } else if (v >= n) {
        v = stepv < 0 ? n - 1 : n;
      }
      return v;
    };
    start = adjust(start, has_start, true);
    stop = adjust(stop, has_stop, false);
    std::vector<std::int64_t> picks;
    if (stepv > 0)
      for (std::int64_t k = start; k < stop; k += stepv) picks.push_back(k);
    else
      for (std::int64_t k = start; k > stop; k += stepv) picks.push_back(k);
    if (is_str) {
      std::string out;
      for (std::int64_t k : picks) append_utf8(out, cps[static_cast<std::size_t>(k)]);
      return Value::string(std::move(out));
    }
    List out;
    out.reserve(picks.size());
    for (std::int64_t k : picks) out.push_back((*obj.list)[static_cast<std::size_t>(k)]);
    return Value::sequence(std::move(out), obj.seq);
  }

  // --- operators ------------------------------------------------------------------------------

  Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (a.is_undefined()) undefined_error(a, line);
    if (b.is_undefined()) undefined_error(b, line);
    auto type_error = [&]() -> Value {
      fail(line, "TypeError: unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (a.is_number() && b.is_number()) {
      bool ints = a.is_integral() && b.is_integral();
      if (ints) {
        std::int64_t x = a.as_int(), y = b.as_int(), r = 0;
        if (op == "+") {
          if (__builtin_add_overflow(x, y, &r)) fail(line, "integer overflow");
          return Value::integer(r);
        }
        if (op == "-") {
          if (__builtin_sub_overflow(x, y, &r)) fail(line, "integer overflow");
          return Value::integer(r);
        }
        if (op == "*") {
          if (__builtin_mul_overflow(x, y, &r)) fail(line, "integer overflow");
          return Value::integer(r);
        }
        if (op == "//" || op == "%") {
          if (y == 0) fail(line, "ZeroDivisionError: integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) fail(line, "integer overflow");
          std::int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            m += y;
            q -= 1;
          }
          return Value::integer(op == "//" ? q : m);
        }
        if (op == "**") {
          if (y >= 0) {
            std::int64_t acc = 1, base = x;
            std::int64_t e = y;
            while (e > 0) {
              if (e & 1)
                if (__builtin_mul_overflow(acc, base, &acc)) fail(line, "integer overflow");
              e >>= 1;
              if (e > 0 && __builtin_mul_overflow(base, base, &base)) fail(line, "integer overflow");
            }
            return Value::integer(acc);
          }
          if (x == 0) fail(line, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
          return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
      }
      double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::number(x + y);
      if (op == "-") return Value::number(x - y);
      if (op == "*") return Value::number(x * y);
      if (op == "/") {
        if (y == 0.0) fail(line, "ZeroDivisionError: division by zero");
        return Value::number(x / y);
      }
      if (op == "//" || op == "%") {
        if (y == 0.0) fail(line, "ZeroDivisionError: float floor division or modulo by zero");
        double d, m;
        py_float_divmod(x, y, &d, &m);
        return Value::number(op == "//" ? d : m);
      }
      if (op == "**") {
        if (x == 0.0 && y < 0) fail(line, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) fail(line, "unsupported: fractional power of a negative number (complex result)");
        double r = std::pow(x, y);
        if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) fail(line, "OverflowError: numerical result out of range");
        return Value::number(r);
      }
      return type_error();
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        check_len(a.str().size() + b.str().size(), line);
        return Value::string(a.str() + b.str());
      }
      if (a.type == Type::List && b.type == Type::List && a.seq == b.seq &&
          (a.seq == SeqKind::List || a.seq == SeqKind::Tuple)) {
        check_count(a.list->size() + b.list->size(), line);
        List items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::sequence(std::move(items), a.seq);
      }
      return type_error();
    }
    if (op == "*") {
      const Value* seq = a.is_integral() ? &b : &a;
      const Value* times = a.is_integral() ? &a : &b;
      if (!times->is_integral()) return type_error();
      std::int64_t n = std::max<std::int64_t>(0, times->as_int());
      if (seq->is_string()) {
        if (!seq->str().empty()) check_len(static_cast<std::size_t>(n) * 1 > lim_.max_output_bytes ? lim_.max_output_bytes + 1 : seq->str().size() * static_cast<std::size_t>(n), line);
        std::string out;
        for (std::int64_t k = 0; k < n && !seq->str().empty(); ++k) out += seq->str();
        return Value::string(std::move(out));
      }
      if (seq->type == Type::List && (seq->seq == SeqKind::List || seq->seq == SeqKind::Tuple)) {
        if (!seq->list->empty())
          check_count(static_cast<std::size_t>(n) > lim_.max_loop_iterations ? lim_.max_loop_iterations + 1 : seq->list->size() * static_cast<std::size_t>(n), line);
        List items;
        for (std::int64_t k = 0; k < n && !seq->list->empty(); ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::sequence(std::move(items), seq->seq);
      }
      return type_error();
    }
    if (op == "%" && a.is_string()) fail(line, "unsupported construct: printf-style string formatting with '%'");
    return type_error();
  }

  // Python's <, <=, >, >= for the types templates compare.
  int order(const Value& a, const Value& b, const std::string& op, int line, int depth = 0) const {
    if (depth > kMaxValueDepth) fail(line, "values nested too deeply to compare");
    if (a.is_undefined()) undefined_error(a, line);
    if (b.is_undefined()) undefined_error(b, line);
    if (a.is_number() && b.is_number()) {
      if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
      double x = a.as_double(), y = b.as_double();
      if (std::isnan(x) || std::isnan(y)) return 2;  // unordered: every comparison false
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
      int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.type == Type::List && b.type == Type::List && a.seq == b.seq && (a.seq == SeqKind::List || a.seq == SeqKind::Tuple)) {
      std::size_t n = std::min(a.list->size(), b.list->size());
      for (std::size_t k = 0; k < n; ++k) {
        if (equals((*a.list)[k], (*b.list)[k])) continue;
        return order((*a.list)[k], (*b.list)[k], op, line, depth + 1);
      }
      return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    fail(line, "TypeError: '" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  bool contains(const Value& hay, const Value& needle, int line) const {
    switch (hay.type) {
      case Type::Undefined: return false;
      case Type::String:
        if (!needle.is_string())
          fail(line, std::string("TypeError: 'in <string>' requires string as left operand, not ") + type_name(needle));
        return hay.str().find(needle.str()) != std::string::npos;
      case Type::List:
        for (const Value& v : *hay.list)
          if (equals(v, needle)) return true;
        return false;
      case Type::Dict:
        if ((needle.type == Type::List && needle.seq != SeqKind::Tuple) || needle.type == Type::Dict ||
            needle.type == Type::Namespace)
          fail(line, std::string("TypeError: unhashable type: '") + type_name(needle) + "'");
        return needle.is_string() && hay.dict->find(needle.str()) != nullptr;
      default: fail(line, std::string("TypeError: argument of type '") + type_name(hay) + "' is not iterable");
    }
  }

  bool compare(const std::string& op, const Value& a, const Value& b, int line) const {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a, line);
    if (op == "notin") return !contains(b, a, line);
    int c = order(a, b, op, line);
    if (c == 2) return false;
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  // --- calls ----------------------------------------------------------------------------------

  Value call(const Expr& e, const FramePtr& f) {
    Value callee = eval(*e.args[0], f);
    Args args = eval_args(e, f);
    if (callee.is_undefined()) undefined_error(callee, e.line);
    if (callee.type != Type::Function) fail(e.line, std::string("TypeError: '") + type_name(callee) + "' object is not callable");
    const Callable& c = *callee.fn;
    switch (c.kind) {
      case Callable::Kind::Macro: return call_macro(c, args, e.line);
      case Callable::Kind::Method: return call_method(c.self, c.name, args, e.line);
      case Callable::Kind::Global: return call_global(c.name, args, e.line);
      case Callable::Kind::Cycle: {
        if (args.pos.empty()) fail(e.line, "loop.cycle() needs at least one argument");
        return args.pos[static_cast<std::size_t>(c.self.i) % args.pos.size()];
      }
    }
    fail(e.line, "unsupported call");
  }

  Value call_macro(const Callable& c, const Args& args, int line) {
    const Stmt& m = *c.macro;
    FramePtr closure = c.closure.lock();
    if (!closure) fail(line, "macro '" + c.name + "' called outside the scope it was defined in");
    if (args.pos.size() > m.params.size())
      fail(line, "macro '" + c.name + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
    if (call_depth_ >= lim_.max_call_depth)
      fail(line, "macro calls nested deeper than the limit of " + std::to_string(lim_.max_call_depth));
    FramePtr frame = child_frame(closure, m, 0);
    std::size_t first_default = m.params.size() - m.defaults.size();
    for (const auto& [k, v] : args.kw)
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end())
        fail(line, "macro '" + c.name + "' takes no keyword argument '" + k + "'");
    for (std::size_t k = 0; k < m.params.size(); ++k) {
      const Value* given = k < args.pos.size() ? &args.pos[k] : nullptr;
      for (const auto& [name, v] : args.kw)
        if (name == m.params[k]) {
          if (given) fail(line, "macro '" + c.name + "' got multiple values for argument '" + name + "'");
          given = &v;
        }
      if (given)
        frame->set(m.params[k], *given);
      else if (k >= first_default)
        frame->set(m.params[k], eval(*m.defaults[k - first_default], frame));
      else
        frame->set(m.params[k], Value::undefined("parameter '" + m.params[k] + "' was not provided"));
    }
    ++call_depth_;
    std::string out;
    try {
      out = capture(m.bodies[0], frame);
    } catch (...) {
      --call_depth_;
      throw;
    }
    --call_depth_;
    return Value::string(std::move(out));
  }

  Value call_global(const std::string& name, const Args& args, int line) {
    if (name == "raise_exception") {
      const Value* msg = args.get(0, "message");
      fail(line, "raise_exception: " + (msg ? text_of(*msg) : std::string()));
    }
    if (name == "namespace" || name == "dict") {
      auto d = std::make_shared<Dict>();
      if (!args.pos.empty()) {
        if (args.pos.size() > 1 || args.pos[0].type != Type::Dict) fail(line, name + "() takes a dict or keyword arguments");
        d->entries = args.pos[0].dict->entries;
      }
      for (const auto& [k, v] : args.kw) d->set(k, v);
      if (name == "dict") return Value::mapping(std::move(d));
      for (const auto& [k, v] : d->entries)
        if (contains_namespace(v, 0)) fail(line, "storing a namespace inside a namespace is not supported");
      Value v;
      v.type = Type::Namespace;
      v.dict = std::move(d);
      return v;
    }
    if (name == "range") {
      if (args.pos.empty() || args.pos.size() > 3 || !args.kw.empty()) fail(line, "range() takes 1 to 3 integer arguments");
      for (const Value& a : args.pos)
        if (!a.is_integral()) fail(line, std::string("TypeError: '") + type_name(a) + "' object cannot be interpreted as an integer");
      std::int64_t start = 0, stop, stepv = 1;
      if (args.pos.size() == 1) {
        stop = args.pos[0].as_int();
      } else {
        start = args.pos[0].as_int();
        stop = args.pos[1].as_int();
        if (args.pos.size() == 3) stepv = args.pos[2].as_int();
      }
      if (stepv == 0) fail(line, "ValueError: range() arg 3 must not be zero");
      long double count = stepv > 0 ? (stop > start ? (static_cast<long double>(stop) - start + stepv - 1) / stepv : 0)
                                    : (start > stop ? (static_cast<long double>(start) - stop - stepv - 1) / -stepv : 0);
      if (count > static_cast<long double>(lim_.max_loop_iterations)) check_count(lim_.max_loop_iterations + 1, line);
      List items;
      for (std::int64_t k = start; stepv > 0 ? k < stop : k > stop; k += stepv) {
        items.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, stepv, &k)) break;
        k -= stepv;
      }
      return Value::sequence(std::move(items), SeqKind::View);
    }
    if (name == "strftime_now") {
      const Value* fmt = args.get(0, "format");
      if (!fmt || !fmt->is_string()) fail(line, "strftime_now() takes a format string");
      if (fmt->str().size() > 256) fail(line, "strftime_now() format longer than 256 bytes");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      // No conversion writes more than 64 bytes, so this never truncates.
      std::string buf(64 * fmt->str().size() + 64, '\0');
      std::size_t n = fmt->str().empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt->str().c_str(), &tm);
      buf.resize(n);
      return Value::string(std::move(buf));
    }
    fail(line, "unsupported function '" + name + "'");
  }

  static std::int64_t int_arg(const Value* v, std::int64_t dflt, const char* what, int line) {
    if (!v || v->is_none()) return dflt;
    if (!v->is_integral()) throw Error("chat template line " + std::to_string(line) + ": " + what + " must be an integer");
    return v->as_int();
  }

  Value call_method(const Value& self, const std::string& name, const Args& args, int line) {
    std::string qual = std::string(type_name(self)) + "." + name;
    auto str_arg = [&](std::size_t k, const char* kw) -> const Value* {
      const Value* v = args.get(k, kw);
      if (v && !v->is_string() && !v->is_none()) fail(line, qual + "() argument must be str, not " + type_name(*v));
      return v;
    };
    if (self.is_string()) {
      const std::string& s = self.str();
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::string(py_strip(s, str_arg(0, "chars"), name != "rstrip", name != "lstrip"));
      if (name == "split" || name == "rsplit") {
        const Value* sep = str_arg(0, "sep");
        std::int64_t maxsplit = int_arg(args.get(1, "maxsplit"), -1, "maxsplit", line);
        List parts;
        for (auto& p : py_split(s, sep, maxsplit, name == "rsplit")) parts.push_back(Value::string(std::move(p)));
        return Value::sequence(std::move(parts));
      }
      if (name == "splitlines") {
        const Value* keep = args.get(0, "keepends");
        List parts;
        for (auto& p : py_splitlines(s, keep && truthy(*keep))) parts.push_back(Value::string(std::move(p)));
        return Value::sequence(std::move(parts));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* arg = args.get(0, "prefix");
        if (!arg) fail(line, qual + "() takes at least 1 argument");
        if (args.pos.size() > 1) fail(line, "unsupported construct: " + qual + "() with start/end");
        std::vector<std::string> cands;
        if (arg->is_string()) {
          cands.push_back(arg->str());
        } else if (arg->type == Type::List && arg->seq == SeqKind::Tuple) {
          for (const Value& v : *arg->list) {
            if (!v.is_string()) fail(line, "TypeError: tuple for " + qual + " must only contain str");
            cands.push_back(v.str());
          }
        } else {
          fail(line, std::string("TypeError: ") + qual + " first arg must be str or a tuple of str, not " + type_name(*arg));
        }
        for (const auto& c : cands) {
          if (c.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "upper") return Value::string(map_chars(s, to_upper));
      if (name == "lower") return Value::string(map_chars(s, to_lower));
      if (name == "title") return Value::string(py_title(s));
      if (name == "capitalize") return Value::string(py_capitalize(s));
      if (name == "replace") {
        const Value* old = args.get(0, "old");
        const Value* repl = args.get(1, "new");
        if (!old || !repl || !old->is_string() || !repl->is_string()) fail(line, qual + "() takes two strings");
        std::int64_t count = int_arg(args.get(2, "count"), -1, "count", line);
        return str_value(py_replace(s, old->str(), repl->str(), count, lim_.max_output_bytes), line);
      }
      if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
        const Value* sub = args.get(0, "sub");
        if (!sub || !sub->is_string()) fail(line, qual + "() takes a string");
        if (args.pos.size() > 1) fail(line, "unsupported construct: " + qual + "() with start/end");
        const std::string& t = sub->str();
        if (name == "count") {
          if (t.empty()) return Value::integer(static_cast<std::int64_t>(utf8_length(s)) + 1);
          std::int64_t n = 0;
          for (std::size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++n;
          return Value::integer(n);
        }
        std::size_t p = (name == "find" || name == "index") ? s.find(t) : s.rfind(t);
        if (p == std::string::npos) {
          if (name == "index" || name == "rindex") fail(line, "ValueError: substring not found");
          return Value::integer(-1);
        }
        return Value::integer(cp_index(s, p));
      }
      if (name == "removeprefix" || name == "removesuffix") {
        const Value* a = args.get(0, "prefix");
        if (!a || !a->is_string()) fail(line, qual + "() takes a string");
        const std::string& t = a->str();
        if (name == "removeprefix" && s.compare(0, t.size(), t) == 0) return Value::string(s.substr(t.size()));
        if (name == "removesuffix" && !t.empty() && s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0)
          return Value::string(s.substr(0, s.size() - t.size()));
        return self;
      }
      if (name == "join") {
        const Value* it = args.get(0, "iterable");
        if (!it) fail(line, qual + "() takes exactly one argument");
        std::string out;
        List items = iterate(*it, line);
        for (std::size_t k = 0; k < items.size(); ++k) {
          if (!items[k].is_string())
            fail(line, "TypeError: sequence item " + std::to_string(k) + ": expected str instance, " + type_name(items[k]) + " found");
          if (k) out += s;
          out += items[k].str();
          check_len(out.size(), line);
        }
        return Value::string(std::move(out));
      }
      if (name == "isspace") {
        std::vector<char32_t> cps = decode_utf8(s);
        return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), py_isspace));
      }
      if (name == "islower" || name == "isupper") return Value::boolean(py_is_case(s, name == "isupper"));
    } else if (self.type == Type::Dict) {
      if (name == "get") {
        const Value* key = args.get(0, "key");
        if (!key) fail(line, "dict.get() takes at least 1 argument");
        const Value* dflt = args.get(1, "default");
        if (key->is_string())
          if (const Value* v = self.dict->find(key->str())) return *v;
        return dflt ? *dflt : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : self.dict->entries) {
          if (name == "keys")
            out.push_back(Value::string(k));
          else if (name == "values")
            out.push_back(v);
          else
            out.push_back(Value::sequence({Value::string(k), v}, SeqKind::Tuple));
        }
        return Value::sequence(std::move(out), SeqKind::View);
      }
    } else if (self.type == Type::List) {
      if (name == "count" || name == "index") {
        const Value* x = args.get(0, "value");
        if (!x) fail(line, qual + "() takes exactly one argument");
        std::int64_t n = 0;
        for (std::size_t k = 0; k < self.list->size(); ++k) {
          if (!equals((*self.list)[k], *x)) continue;
          if (name == "index") return Value::integer(static_cast<std::int64_t>(k));
          ++n;
        }
        if (name == "index") fail(line, "ValueError: the " + std::string(type_name(*x)) + " value is not in the list");
        return Value::integer(n);
      }
    }
    fail(line, "unsupported method '" + qual + "'");
  }

  // --- filters --------------------------------------------------------------------------------

  // Jinja's attribute getter: "a.b.0" walks items and attributes; digit parts are indexes.
  Value attr_path(const Value& item, const std::string& path, int line) const {
    Value cur = item;
    std::size_t start = 0;
    for (;;) {
      std::size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (cur.is_undefined()) undefined_error(cur, line);
      cur = digits && part.size() < 18 ? get_item(cur, Value::integer(std::stoll(part)), line) : get_item(cur, Value::string(part), line);
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Value attr_arg(const Args& a, std::size_t k, const char* kw, int line) const {
    const Value* v = a.get(k, kw);
    if (!v) fail(line, std::string("filter needs the '") + kw + "' argument");
    if (v->is_integral()) return Value::string(std::to_string(v->as_int()));
    if (!v->is_string()) fail(line, std::string("the '") + kw + "' argument must be a string");
    return *v;
  }

  // Sort key for sort/unique/min/max/dictsort: strings compare case-insensitively unless asked.
  static Value fold_case(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value::string(map_chars(v.str(), to_lower));
    return v;
  }

  void stable_sort_values(std::vector<std::pair<Value, Value>>& keyed, bool reverse, int line) const {
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      int c = reverse ? order(y.first, x.first, "<", line) : order(x.first, y.first, "<", line);
      return c == -1;
    });
  }

  Value apply_filter(const std::string& name, const Value& v, const Args& a, int line) {
    auto soft = [&](const Value& x) { return text_of(x); };
    auto flag = [&](std::size_t k, const char* kw, bool dflt) {
      const Value* x = a.get(k, kw);
      return x ? truthy(*x) : dflt;
    };
    if (name == "tojson") {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      JsonOptions opt;
      opt.limit = lim_.max_output_bytes;
      opt.ensure_ascii = flag(0, "ensure_ascii", false);
      const Value* indent = a.get(1, "indent");
      if (indent && !indent->is_none()) {
        opt.has_indent = true;
        if (indent->is_integral())
          opt.indent = std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(indent->as_int(), 0, 64)), ' ');
        else if (indent->is_string())
          opt.indent = indent->str();
        else
          fail(line, "tojson: indent must be an integer or a string");
        opt.item_sep = ",";
      }
      const Value* seps = a.get(2, "separators");
      if (seps && !seps->is_none()) {
        if (seps->type != Type::List || seps->list->size() != 2 || !(*seps->list)[0].is_string() || !(*seps->list)[1].is_string())
          fail(line, "tojson: separators must be a pair of strings");
        opt.item_sep = (*seps->list)[0].str();
        opt.key_sep = (*seps->list)[1].str();
      }
      opt.sort_keys = flag(3, "sort_keys", false);
      for (const auto& [k, x] : a.kw)
        if (k != "ensure_ascii" && k != "indent" && k != "separators" && k != "sort_keys")
          fail(line, "tojson() got an unexpected keyword argument '" + k + "'");
      if (v.is_undefined()) fail(line, "tojson: Object of type Undefined is not JSON serializable");
      return str_value(to_json(v, opt), line);
    }
    if (name == "trim") return Value::string(py_strip(soft(v), a.get(0, "chars"), true, true));
    if (name == "length" || name == "count") {
      switch (v.type) {
        case Type::Undefined: return Value::integer(0);
        case Type::String: return Value::integer(static_cast<std::int64_t>(utf8_length(v.str())));
        case Type::List:
          if (v.seq != SeqKind::Iterator) return Value::integer(static_cast<std::int64_t>(v.list->size()));
          break;
        case Type::Dict: return Value::integer(static_cast<std::int64_t>(v.dict->entries.size()));
        default: break;
      }
      fail(line, std::string("TypeError: object of type '") + type_name(v) + "' has no len()");
    }
    if (name == "string" || name == "safe") return Value::string(soft(v));
    if (name == "lower") return Value::string(map_chars(soft(v), to_lower));
    if (name == "upper") return Value::string(map_chars(soft(v), to_upper));
    if (name == "capitalize") return Value::string(py_capitalize(soft(v)));
    if (name == "title") return Value::string(jinja_title(soft(v)));
    if (name == "first" || name == "last") {
      if (name == "last" && v.type == Type::List && v.seq == SeqKind::Iterator)
        fail(line, "TypeError: the last item of a generator is not available; apply |list first");
      List items = iterate(v, line);
      if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::string d = sep ? soft(*sep) : "";
      std::string out;
      List items = iterate(v, line);
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += d;
        out += soft(attr && !attr->is_none() ? attr_path(items[k], attr_arg(a, 1, "attribute", line).str(), line) : items[k]);
        check_len(out.size(), line);
      }
      return Value::string(std::move(out));
    }
    if (name == "replace") {
      const Value* old = a.get(0, "old");
      const Value* repl = a.get(1, "new");
      if (!old || !repl) fail(line, "replace filter takes old and new");
      std::int64_t count = int_arg(a.get(2, "count"), -1, "count", line);
      return str_value(py_replace(soft(v), soft(*old), soft(*repl), count, lim_.max_output_bytes), line);
    }
    if (name == "default" || name == "d") {
      const Value* dflt = a.get(0, "default_value");
      bool boolean = flag(1, "boolean", false);
      if (v.is_undefined() || (boolean && !truthy(v))) return dflt ? *dflt : Value::string("");
      return v;
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::sequence({}, SeqKind::Iterator);
      if (v.type != Type::Dict) fail(line, "TypeError: can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, x] : v.dict->entries) out.push_back(Value::sequence({Value::string(k), x}, SeqKind::Tuple));
      return Value::sequence(std::move(out), SeqKind::Iterator);
    }
    if (name == "list") return Value::sequence(iterate(v, line));
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      bool by_attr = name == "selectattr" || name == "rejectattr";
      bool want = name == "select" || name == "selectattr";
      std::size_t test_pos = by_attr ? 1 : 0;
      std::string attr = by_attr ? attr_arg(a, 0, "attribute", line).str() : "";
      std::string test;
      if (a.pos.size() > test_pos) {
        if (!a.pos[test_pos].is_string()) fail(line, name + ": the test name must be a string");
        test = a.pos[test_pos].str();
        if (!is_known_test(test)) fail(line, "unsupported construct: test '" + test + "'");
      }
      Args test_args;
      for (std::size_t k = test_pos + 1; k < a.pos.size(); ++k) test_args.pos.push_back(a.pos[k]);
      test_args.kw = a.kw;
      List out;
      // Jinja yields nothing for a false value (None, empty) without iterating it.
      for (const Value& item : truthy(v) ? iterate(v, line) : List{}) {
        step(line);
        Value subject = by_attr ? attr_path(item, attr, line) : item;
        bool r = test.empty() ? truthy(subject) : apply_test(test, subject, test_args, line);
        if (r == want) out.push_back(item);
      }
      return Value::sequence(std::move(out), SeqKind::Iterator);
    }
    if (name == "map") {
      List out;
      const Value* attr = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "attribute") attr = &x;
      if (attr) {
        const Value* dflt = nullptr;
        for (const auto& [k, x] : a.kw)
          if (k == "default") dflt = &x;
          else if (k != "attribute") fail(line, "map() got an unexpected keyword argument '" + k + "'");
        Args tmp;
        tmp.kw.emplace_back("attribute", *attr);
        std::string path = attr_arg(tmp, 0, "attribute", line).str();
        for (const Value& item : truthy(v) ? iterate(v, line) : List{}) {
          step(line);
          Value r = attr_path(item, path, line);
          out.push_back(r.is_undefined() && dflt ? *dflt : r);
        }
      } else {
        if (a.pos.empty() || !a.pos[0].is_string()) fail(line, "map() needs a filter name or attribute=");
        std::string filter = a.pos[0].str();
        if (!is_known_filter(filter)) fail(line, "unsupported construct: filter '" + filter + "'");
        Args fargs;
        fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
        fargs.kw = a.kw;
        for (const Value& item : truthy(v) ? iterate(v, line) : List{}) {
          step(line);
          out.push_back(apply_filter(filter, item, fargs, line));
        }
      }
      return Value::sequence(std::move(out), SeqKind::Iterator);
    }
    if ((name == "int" || name == "float") && v.is_undefined()) undefined_error(v, line);
    if (name == "int") {
      std::int64_t dflt = int_arg(a.get(0, "default"), 0, "default", line);
      const Value* base = a.get(1, "base");
      if (base && !(base->is_integral() && base->as_int() == 10)) fail(line, "unsupported construct: int filter with a base other than 10");
      if (v.is_integral()) return Value::integer(v.as_int());
      if (v.type == Type::Float) {
        if (!std::isfinite(v.f)) fail(line, "OverflowError: cannot convert float infinity or NaN to integer");
        if (std::fabs(v.f) >= 9.2e18) fail(line, "int: value out of the 64-bit range");
        return Value::integer(static_cast<std::int64_t>(v.f));
      }
      if (v.is_string()) {
        std::int64_t r;
        if (parse_py_int(v.str(), &r)) return Value::integer(r);
        double d;
        if (parse_py_float(v.str(), &d)) {
          if (!std::isfinite(d)) fail(line, "OverflowError: cannot convert float infinity or NaN to integer");
          if (std::fabs(d) >= 9.2e18) fail(line, "int: value out of the 64-bit range");
          return Value::integer(static_cast<std::int64_t>(d));
        }
      }
      return Value::integer(dflt);
    }
    if (name == "float") {
      const Value* dflt = a.get(0, "default");
      if (v.is_number()) return Value::number(v.as_double());
      double d;
      if (v.is_string() && parse_py_float(v.str(), &d)) return Value::number(d);
      return dflt ? *dflt : Value::number(0.0);
    }
    if (name == "round") {
      std::int64_t precision = int_arg(a.get(0, "precision"), 0, "precision", line);
      const Value* method = a.get(1, "method");
      std::string m = method ? soft(*method) : "common";
      if (m != "common" && m != "ceil" && m != "floor") fail(line, "round: method must be common, ceil or floor");
      if (!v.is_number()) fail(line, std::string("TypeError: type ") + type_name(v) + " doesn't define __round__ method");
      if (m == "common") {
        if (v.is_integral() && precision >= 0) return Value::integer(v.as_int());
        if (v.is_integral()) fail(line, "round: negative precision is not supported");
        return Value::number(py_round(v.f, precision));
      }
      if (precision < 0 || precision > 300) fail(line, "round: precision out of range");
      double scale = std::pow(10.0, static_cast<double>(precision));
      double x = v.as_double() * scale;
      return Value::number((m == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    if (name == "abs") {
      if (v.type == Type::Float) return Value::number(std::fabs(v.f));
      if (v.is_integral()) {
        if (v.as_int() == INT64_MIN) fail(line, "integer overflow");
        return Value::integer(std::llabs(v.as_int()));
      }
      fail(line, std::string("TypeError: bad operand type for abs(): '") + type_name(v) + "'");
    }
    if (name == "sort" || name == "unique" || name == "max" || name == "min") {
      bool is_sort = name == "sort";
      bool reverse = is_sort && flag(0, "reverse", false);
      bool case_sensitive = flag(is_sort ? 1 : 0, "case_sensitive", false);
      const Value* attr = a.get(is_sort ? 2 : 1, "attribute");
      std::string path = attr && !attr->is_none() ? attr_arg(a, is_sort ? 2 : 1, "attribute", line).str() : "";
      std::vector<std::pair<Value, Value>> keyed;
      for (const Value& item : iterate(v, line)) {
        step(line);
        keyed.emplace_back(fold_case(path.empty() ? item : attr_path(item, path, line), case_sensitive), item);
      }
      if (name == "unique") {
        List out;
        std::vector<Value> seen;
        for (auto& [k, item] : keyed) {
          // Jinja collects seen keys in a set, so unhashable items fail as in Python.
          if ((k.type == Type::List && k.seq != SeqKind::Tuple) || k.type == Type::Dict || k.type == Type::Namespace)
            fail(line, std::string("TypeError: unhashable type: '") + type_name(k) + "'");
          bool dup = false;
          for (const Value& s : seen) dup = dup || equals(s, k);
          if (dup) continue;
          seen.push_back(k);
          out.push_back(item);
          step(line);
        }
        return Value::sequence(std::move(out), SeqKind::Iterator);
      }
      if (!is_sort) {
        if (keyed.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        std::size_t best = 0;
        for (std::size_t k = 1; k < keyed.size(); ++k) {
          int c = order(keyed[k].first, keyed[best].first, "<", line);
          if (name == "max" ? c == 1 : c == -1) best = k;
        }
        return keyed[best].second;
      }
      stable_sort_values(keyed, reverse, line);
      List out;
      for (auto& [k, item] : keyed) out.push_back(std::move(item));
      return Value::sequence(std::move(out));
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::vector<char32_t> cps = decode_utf8(v.str());
        std::reverse(cps.begin(), cps.end());
        return Value::string(encode_utf8(cps, 0, cps.size()));
      }
      bool from_iterator = v.type == Type::List && v.seq == SeqKind::Iterator;
      List items = iterate(v, line);
      std::reverse(items.begin(), items.end());
      return Value::sequence(std::move(items), from_iterator ? SeqKind::List : SeqKind::Iterator);
    }
    if (name == "sum") {
      const Value* attr = a.get(0, "attribute");
      const Value* start = a.get(1, "start");
      Value acc = start ? *start : Value::integer(0);
      std::string path = attr && !attr->is_none() ? attr_arg(a, 0, "attribute", line).str() : "";
      for (const Value& item : iterate(v, line)) {
        step(line);
        acc = binary("+", acc, path.empty() ? item : attr_path(item, path, line), line);
      }
      return acc;
    }
    if (name == "dictsort") {
      if (v.type != Type::Dict) fail(line, "dictsort: argument must be a dict");
      bool case_sensitive = flag(0, "case_sensitive", false);
      const Value* by = a.get(1, "by");
      std::string by_s = by ? soft(*by) : "key";
      if (by_s != "key" && by_s != "value") fail(line, "dictsort: 'by' must be 'key' or 'value'");
      bool reverse = flag(2, "reverse", false);
      std::vector<std::pair<Value, Value>> keyed;
      for (const auto& [k, x] : v.dict->entries)
        keyed.emplace_back(fold_case(by_s == "key" ? Value::string(k) : x, case_sensitive),
                           Value::sequence({Value::string(k), x}, SeqKind::Tuple));
      stable_sort_values(keyed, reverse, line);
      List out;
      for (auto& [k, item] : keyed) out.push_back(std::move(item));
      return Value::sequence(std::move(out));
    }
    if (name == "center") {
      std::int64_t width = int_arg(a.get(0, "width"), 80, "width", line);
      std::string s = soft(v);
      auto len = static_cast<std::int64_t>(utf8_length(s));
      if (width <= len) return Value::string(s);
      check_len(static_cast<std::size_t>(width), line);
      std::int64_t marg = width - len;
      std::int64_t left = marg / 2 + (marg & width & 1);
      return Value::string(std::string(static_cast<std::size_t>(left), ' ') + s + std::string(static_cast<std::size_t>(marg - left), ' '));
    }
    if (name == "indent") {
      const Value* w = a.get(0, "width");
      std::string ind;
      if (w && w->is_string())
        ind = w->str();
      else
        ind = std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(int_arg(w, 4, "width", line), 0, 256)), ' ');
      bool first = flag(1, "first", false);
      bool blank = flag(2, "blank", false);
      if (v.is_undefined()) undefined_error(v, line);
      if (!v.is_string()) fail(line, std::string("TypeError: unsupported operand type(s) for +=: '") + type_name(v) + "' and 'str'");
      std::vector<std::string> lines = py_splitlines(v.str() + "\n", false);
      std::string rv;
      if (blank) {
        for (std::size_t k = 0; k < lines.size(); ++k) {
          if (k) rv += "\n" + ind;
          rv += lines[k];
          check_len(rv.size(), line);
        }
      } else if (!lines.empty()) {
        rv = lines[0];
        for (std::size_t k = 1; k < lines.size(); ++k) {
          rv += "\n";
          if (!lines[k].empty()) rv += ind;
          rv += lines[k];
          check_len(rv.size(), line);
        }
      }
      if (first) rv = ind + rv;
      return str_value(std::move(rv), line);
    }
    fail(line, "unsupported construct: filter '" + name + "'");
  }

  // --- tests ----------------------------------------------------------------------------------

  bool apply_test(const std::string& name, const Value& v, const Args& a, int line) {
    const Value* arg = a.get(0, "other");
    auto need_arg = [&]() -> const Value& {
      if (!arg) fail(line, "test '" + name + "' needs an argument");
      return *arg;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.type == Type::Bool;
    if (name == "true") return v.type == Type::Bool && v.b;
    if (name == "false") return v.type == Type::Bool && !v.b;
    if (name == "integer") return v.type == Type::Int;
    if (name == "float") return v.type == Type::Float;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.type == Type::Dict;
    if (name == "iterable") return v.is_undefined() || v.is_string() || v.type == Type::List || v.type == Type::Dict;
    // Undefined has __len__ and __getitem__, which is all Jinja's test looks for.
    if (name == "sequence")
      return v.is_undefined() || v.is_string() || v.type == Type::Dict || (v.type == Type::List && (v.seq == SeqKind::List || v.seq == SeqKind::Tuple));
    // Jinja's Undefined defines __call__ (to raise), so Python calls it callable.
    if (name == "callable") return v.type == Type::Function || v.is_undefined();
    if (name == "in") return contains(need_arg(), v, line);
    if (name == "even" || name == "odd" || name == "divisibleby") {
      Value divisor = name == "divisibleby" ? need_arg() : Value::integer(2);
      Value m = binary("%", v, divisor, line);
      return equals(m, Value::integer(name == "odd" ? 1 : 0));
    }
    if (name == "eq" || name == "equalto") return equals(v, need_arg());
    if (name == "ne") return !equals(v, need_arg());
    if (name == "lt" || name == "lessthan") return compare("<", v, need_arg(), line);
    if (name == "le") return compare("<=", v, need_arg(), line);
    if (name == "gt" || name == "greaterthan") return compare(">", v, need_arg(), line);
    if (name == "ge") return compare(">=", v, need_arg(), line);
    if (name == "lower" || name == "upper") return py_is_case(text_of(v), name == "upper");
    fail(line, "unsupported construct: test '" + name + "'");
  }
};

bool is_known_filter(std::string_view name) { return in_table(kFilters, name); }
bool is_known_test(std::string_view name) { return in_table(kTests, name); }

}  // namespace detail

ChatTemplate::ChatTemplate(std::string source, Limits limits)
    : program_(detail::parse_template(source, limits)), limits_(limits) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string select_chat_template(const nlohmann::json& field, bool has_tools, const std::string& where) {
  if (field.is_string()) return field.get<std::string>();
  if (field.is_null()) throw Error(where + ": no chat_template (the model has no chat format)");
  const nlohmann::json* by_default = nullptr;
  const nlohmann::json* tool_use = nullptr;
  if (field.is_object()) {  // {name: template}, the form transformers holds in memory
    for (auto it = field.begin(); it != field.end(); ++it) {
      if (!it->is_string()) throw Error(where + ": chat_template entry '" + it.key() + "' must be a string");
      if (it.key() == "default") by_default = &*it;
      if (it.key() == "tool_use") tool_use = &*it;
    }
  } else if (!field.is_array()) {
    throw Error(where + ": chat_template must be a string or a list of {name, template}");
  }
  for (std::size_t k = 0; field.is_array() && k < field.size(); ++k) {
    const nlohmann::json& entry = field[k];
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string())
      throw Error(where + ": chat_template list entries must be {\"name\": string, \"template\": string}");
    if (entry["name"] == "default") by_default = &entry["template"];
    if (entry["name"] == "tool_use") tool_use = &entry["template"];
  }
  if (has_tools && tool_use) return tool_use->get<std::string>();
  if (by_default) return by_default->get<std::string>();
  throw Error(where + ": chat_template has no \"default\" entry" + (has_tools ? " and no \"tool_use\" entry" : ""));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) throw Error("chat template context must be a JSON object");
  auto root = std::make_shared<detail::Frame>();
  for (const auto& [k, v] : context.items()) {
    try {
      root->set(k, detail::from_json(v));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error("chat template context '" + k + "': " + e.what());
    }
  }
  std::string out;
  detail::Interp interp(limits_, &out);
  interp.run(*program_, root);
  return out;
}

}  // namespace ingot::tmpl
