// Interpreter of the chat template engine, its core: statements (scoping, loops, assignment),
// expressions, Jinja's attribute and item lookup, and Python's operators, under the sandbox
// limits. Calls live in template_call.cpp, filters and tests in template_filters.cpp; the class
// is declared in template_interp.h. Hand-written, as the whole Jinja subset is: Debian packages
// no C++ Jinja implementation (see chat_template.h).
#include "template/template_interp.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <stdexcept>

#include "template/template_pystr.h"

namespace ingot::tmpl::detail {
namespace {

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

Value method_value(const Value& self, const std::string& name) {
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
bool python_attr(const Value& v, const std::string& name, Value* out) {
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

std::string object_name(const Value& v) { return std::string(type_name(v)) + " object"; }

}  // namespace

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

std::int64_t int_arg(const Value* v, std::int64_t dflt, const char* what, int line) {
  if (!v || v->is_none()) return dflt;
  if (!v->is_integral()) fail(line, std::string(what) + " must be an integer");
  return v->as_int();
}

void Interp::run(const Program& prog, const FramePtr& root) {
  try {
    mark_undefined(*root, prog.undefined_on_entry);
    exec_body(prog.body, root);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(line_, "out of memory");
  } catch (const std::exception& e) {
    fail(line_, e.what());
  }
}

void Interp::step(int line) {
  line_ = line;
  if (++steps_ > lim_.max_steps)
    fail(line, "template exceeded the limit of " + std::to_string(lim_.max_steps) + " evaluation steps");
}

void Interp::check_len(std::size_t n, int line) const {
  if (n > lim_.max_output_bytes)
    fail(line, "a string of " + std::to_string(n) + " bytes exceeds the output limit of " +
                   std::to_string(lim_.max_output_bytes) + " bytes");
}

void Interp::check_count(std::size_t n, int line) const {
  if (n > lim_.max_loop_iterations)
    fail(line, "a sequence of " + std::to_string(n) + " items exceeds the limit of " +
                   std::to_string(lim_.max_loop_iterations) + " items");
}

Value Interp::str_value(std::string s, int line) const {
  check_len(s.size(), line);
  return Value::string(std::move(s));
}

void Interp::emit(const std::string& s, int line) {
  out_->append(s);
  check_len(out_->size(), line);
}

void Interp::mark_undefined(Frame& f, const std::vector<std::string>& names) {
  for (const auto& n : names) f.set(n, Value::undefined("'" + n + "' is undefined"));
}

FramePtr Interp::child_frame(const FramePtr& parent, const Stmt& s, std::size_t body) {
  auto frame = std::make_shared<Frame>(Frame{{}, parent});
  if (body < s.undefined_on_entry.size()) mark_undefined(*frame, s.undefined_on_entry[body]);
  return frame;
}

// --- statements -------------------------------------------------------------------------------

Interp::Flow Interp::exec_body(const Body& body, const FramePtr& f) {
  for (const auto& s : body) {
    Flow fl = exec(*s, f);
    if (fl != Flow::Normal) return fl;
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec(const Stmt& s, const FramePtr& f) {
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

std::string Interp::capture(const Body& body, const FramePtr& f) {
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

void Interp::assign(const Target& t, Value v, const FramePtr& f, int line) {
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

Interp::Flow Interp::exec_for(const Stmt& s, const FramePtr& f) {
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

void Interp::count_iteration(int line) {
  if (++iterations_ > lim_.max_loop_iterations)
    fail(line, "template exceeded the limit of " + std::to_string(lim_.max_loop_iterations) + " loop iterations");
}

// Python iter(): the items a for loop, list(), join() and friends see.
List Interp::iterate(const Value& v, int line) const {
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

// --- expressions ------------------------------------------------------------------------------

Value Interp::eval(const Expr& e, const FramePtr& f) {
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

Value Interp::lookup(const std::string& name, const FramePtr& f) const {
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

Args Interp::eval_args(const Expr& e, const FramePtr& f) {
  Args a;
  std::size_t n_kw = e.kwnames.size();
  std::size_t n_pos = e.args.size() - 1 - n_kw;
  for (std::size_t k = 0; k < n_pos; ++k) a.pos.push_back(eval(*e.args[1 + k], f));
  for (std::size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kwnames[k], eval(*e.args[1 + n_pos + k], f));
  return a;
}

// Jinja's sandboxed getattr: the Python attribute first, then the item of that name.
Value Interp::get_attr(const Value& obj, const std::string& name, int line) const {
  if (obj.is_undefined()) undefined_error(obj, line);
  Value m;
  if (python_attr(obj, name, &m)) return m;
  if (obj.type == Type::Dict || obj.type == Type::Namespace) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
}

// Jinja's getitem: the item first, then (for a string key) the attribute.
Value Interp::get_item(const Value& obj, const Value& key, int line) const {
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

std::int64_t Interp::slice_bound(const Expr* e, const FramePtr& f, bool* given) {
  *given = false;
  if (!e) return 0;
  Value v = eval(*e, f);
  if (v.is_none()) return 0;
  if (!v.is_integral()) fail(e->line, "TypeError: slice indices must be integers or None");
  *given = true;
  return v.as_int();
}

Value Interp::slice(const Value& obj, const Expr& sl, const FramePtr& f) {
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

// --- operators --------------------------------------------------------------------------------

Value Interp::binary(const std::string& op, const Value& a, const Value& b, int line) {
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
      if (a.markup != b.markup) {  // Markup + str escapes the str, and so does str + Markup
        std::string l = a.markup ? a.str() : html_escape(a.str()), r = b.markup ? b.str() : html_escape(b.str());
        check_len(l.size() + r.size(), line);
        Value v = Value::string(l + r);
        v.markup = true;
        return v;
      }
      check_len(a.str().size() + b.str().size(), line);
      Value v = Value::string(a.str() + b.str());
      v.markup = a.markup;
      return v;
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
int Interp::order(const Value& a, const Value& b, const std::string& op, int line, int depth) const {
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

bool Interp::contains(const Value& hay, const Value& needle, int line) const {
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

bool Interp::compare(const std::string& op, const Value& a, const Value& b, int line) const {
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

}  // namespace ingot::tmpl::detail
