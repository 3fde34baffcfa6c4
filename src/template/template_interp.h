// Interpreter of the chat template engine: walks the syntax tree of template_parse.cpp over the
// values of template_value.cpp with Jinja2's semantics and enforces the sandbox limits. Its
// methods are spread over files by concern: template_interp.cpp (statements, expressions,
// attribute lookup, operators), template_call.cpp (macros, globals, the Python methods templates
// call on strings, dicts and lists) and template_filters.cpp (filters and tests, one function
// each, found through name-sorted tables). Hand-written, as the whole Jinja subset is: Debian
// packages no C++ Jinja implementation (see chat_template.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/template_internal.h"

namespace ingot::tmpl::detail {

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

// The evaluated arguments of a call, filter or test.
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

[[noreturn]] inline void undefined_error(const Value& v, int line) { fail(line, "UndefinedError: " + v.str()); }
// An optional integer argument: dflt when absent or None.
std::int64_t int_arg(const Value* v, std::int64_t dflt, const char* what, int line);
// A namespace may not be stored inside a namespace (Jinja would share it by reference).
bool contains_namespace(const Value& v, int depth);

class Interp {
 public:
  Interp(const Limits& limits, std::string* out) : lim_(limits), out_(out) {}

  void run(const Program& prog, const FramePtr& root);

  // What filters and tests use of the interpreter.
  const Limits& limits() const { return lim_; }
  void step(int line);
  void check_len(std::size_t n, int line) const;
  void check_count(std::size_t n, int line) const;
  Value str_value(std::string s, int line) const;
  // Python str(v), bounded by the output limit.
  std::string text_of(const Value& v) const { return to_str(v, lim_.max_output_bytes); }
  List iterate(const Value& v, int line) const;
  Value get_item(const Value& obj, const Value& key, int line) const;
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  int order(const Value& a, const Value& b, const std::string& op, int line, int depth = 0) const;
  bool contains(const Value& hay, const Value& needle, int line) const;
  bool compare(const std::string& op, const Value& a, const Value& b, int line) const;
  Value apply_filter(const std::string& name, const Value& v, const Args& a, int line);
  bool apply_test(const std::string& name, const Value& v, const Args& a, int line);

 private:
  enum class Flow : std::uint8_t { Normal, Break, Continue };

  const Limits& lim_;
  std::string* out_;
  int line_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t iterations_ = 0;
  int call_depth_ = 0;

  void emit(const std::string& s, int line);
  static void mark_undefined(Frame& f, const std::vector<std::string>& names);
  static FramePtr child_frame(const FramePtr& parent, const Stmt& s, std::size_t body);

  // template_interp.cpp
  Flow exec_body(const Body& body, const FramePtr& f);
  Flow exec(const Stmt& s, const FramePtr& f);
  std::string capture(const Body& body, const FramePtr& f);
  void assign(const Target& t, Value v, const FramePtr& f, int line);
  Flow exec_for(const Stmt& s, const FramePtr& f);
  void count_iteration(int line);
  Value eval(const Expr& e, const FramePtr& f);
  Value lookup(const std::string& name, const FramePtr& f) const;
  Args eval_args(const Expr& e, const FramePtr& f);
  Value get_attr(const Value& obj, const std::string& name, int line) const;
  std::int64_t slice_bound(const Expr* e, const FramePtr& f, bool* given);
  Value slice(const Value& obj, const Expr& sl, const FramePtr& f);

  // template_call.cpp
  Value call(const Expr& e, const FramePtr& f);
  Value call_macro(const Callable& c, const Args& args, int line);
  Value call_global(const std::string& name, const Args& args, int line);
  Value call_method(const Value& self, const std::string& name, const Args& args, int line);
};

}  // namespace ingot::tmpl::detail
