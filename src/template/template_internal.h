// Internal types of the chat template engine (see chat_template.h): the value model with Python
// semantics, the syntax tree the parser builds, and the helpers shared by parser and interpreter.
// Not part of the public interface.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "template/chat_template.h"

namespace ingot::tmpl::detail {

// Every error a template raises, at parse or render time, names the template line.
[[noreturn]] inline void fail(int line, const std::string& msg) {
  throw Error("chat template line " + std::to_string(line) + ": " + msg);
}

// ---------------------------------------------------------------------------------------------
// Values

enum class Type : std::uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

// Lists model several Python sequence types because they differ in what a template can observe:
// printing a tuple gives (a, b); a generator (from select/map/...) is always truthy and has no
// len(); dict views and range() objects print as their type. Printing the last two is an error
// rather than an imitation of CPython's object reprs.
enum class SeqKind : std::uint8_t { List, Tuple, Iterator, View };

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Callable;

struct Value {
  Type type = Type::Undefined;
  SeqKind seq = SeqKind::List;
  bool b = false;
  // A string marked safe (Jinja's Markup, from |safe): + with a plain string HTML-escapes the plain
  // one even without autoescape, as markupsafe's __add__/__radd__ do, and a few filters and methods
  // keep the mark (with_markup_of).
  bool markup = false;
  std::int64_t i = 0;
  double f = 0.0;
  // String payload; for Undefined, the message an access to it raises.
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;  // Dict, or Namespace (the one mutable kind)
  std::shared_ptr<const Callable> fn;

  static Value undefined(std::string why);
  static Value none();
  static Value boolean(bool v);
  static Value integer(std::int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value sequence(List items, SeqKind kind = SeqKind::List);
  static Value mapping(std::shared_ptr<Dict> d);

  // v with this value's safe mark: for the operations that return Markup from a Markup.
  Value with_markup_of(const Value& from) && {
    markup = from.is_string() && from.markup;
    return std::move(*this);
  }

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_list() const { return type == Type::List; }
  bool is_dict() const { return type == Type::Dict; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
  bool is_integral() const { return type == Type::Int || type == Type::Bool; }
  const std::string& str() const { return *s; }
  std::int64_t as_int() const { return type == Type::Bool ? (b ? 1 : 0) : i; }
  double as_double() const { return type == Type::Float ? f : static_cast<double>(as_int()); }
};

struct Dict {
  // Insertion-ordered, as Python dicts are; entries are few, so a linear scan is fine.
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

// Python's type name, for error messages ("'<' not supported between 'int' and 'str'").
const char* type_name(const Value& v);
bool truthy(const Value& v);
// Python ==, with Jinja's rule that undefined equals undefined.
bool equals(const Value& a, const Value& b);

// Python str() / repr() / json.dumps(); they throw std::runtime_error (turned into ingot::Error
// with the template line by the caller) for values Python could not format either, and as soon
// as the text passes `limit` bytes (a small list repeated can print as gigabytes).
std::string to_str(const Value& v, std::size_t limit);
std::string repr(const Value& v, std::size_t limit);
std::string py_float_repr(double d);
// markupsafe.escape: & < > " ' as entities (what a Markup concatenation does to a plain string).
std::string html_escape(std::string_view s);
struct JsonOptions {
  std::size_t limit = 0;
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
};
std::string to_json(const Value& v, const JsonOptions& opt);
// depth guards against stack exhaustion on pathologically nested input.
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers: Python strings index by code point.

std::vector<char32_t> decode_utf8(std::string_view s);
void append_utf8(std::string& out, char32_t c);
// Python's escape of a code point: \xhh, \uhhhh or \Uhhhhhhhh by its size.
void append_py_escape(std::string& out, char32_t c);
std::string encode_utf8(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end);
bool is_ascii(std::string_view s);
bool py_isspace(char32_t c);
std::size_t utf8_length(std::string_view s);

// ---------------------------------------------------------------------------------------------
// Syntax tree

enum class ExprKind : std::uint8_t {
  Const, Name, List, Tuple, Dict, GetAttr, GetItem, Slice, Call, Filter, Test, Neg, Pos, Not,
  Binary, Compare, And, Or, CondExpr, Concat
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value constant;                          // Const
  std::string name;                        // Name, GetAttr attribute, Filter/Test name, Binary/Compare op
  std::vector<std::unique_ptr<Expr>> args;  // operands, items, call arguments (first = callee/subject)
  std::vector<std::string> kwnames;         // keyword argument names: the last kwnames.size() args
  std::vector<std::string> ops;             // Compare: operator per following operand
  bool negated = false;                     // Test: `is not`
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtKind : std::uint8_t {
  Text, Print, If, For, Set, SetBlock, Macro, Break, Continue, Scope
};

// Assignment target: a name, a namespace attribute (ns.attr), or a tuple of names.
struct Target {
  std::vector<std::string> names;  // one name, or several for unpacking
  std::string ns_attr;             // non-empty: names[0].ns_attr = value
  bool tuple = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                     // Text; Macro name
  ExprPtr expr;                         // Print, Set value, For iterable
  ExprPtr cond;                         // For filter (`for x in y if cond`)
  std::vector<ExprPtr> conds;           // If: condition per branch (else branch has none)
  std::vector<Body> bodies;             // If branches; For {body, else}; SetBlock/Macro/Scope {body}
  Target target;                        // Set, SetBlock, For
  std::vector<std::string> params;      // Macro parameters
  std::vector<ExprPtr> defaults;        // Macro defaults, aligned to the last params
  // Per body that runs in a scope of its own (For body/else, Macro, SetBlock, Scope): the names
  // Jinja's compiler initialises as undefined on entry (see analyze_scopes in template_parse.cpp).
  std::vector<std::vector<std::string>> undefined_on_entry;
};

struct Program {
  Body body;
  std::vector<std::string> undefined_on_entry;  // of the top-level scope
};

// Parses template source into a Program; throws ingot::Error naming the line.
std::unique_ptr<Program> parse_template(const std::string& source, const Limits& limits);

// Filters and tests the interpreter implements; the parser rejects any other name up front.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace ingot::tmpl::detail
