// Parser of the chat template engine: turns the lexer's tokens (template_lex.cpp) into the syntax
// tree of template_internal.h, then finds the names each scope starts with undefined. The grammar
// and operator precedence follow Jinja2's parser; constructs outside the supported subset are
// rejected here with the line and the construct named. Hand-written, as the whole Jinja subset
// is: Debian packages no C++ Jinja implementation (see chat_template.h).
#include <algorithm>

#include "template/template_lex.h"

namespace ingot::tmpl::detail {
namespace {

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

}  // namespace

std::unique_ptr<Program> parse_template(const std::string& source, const Limits& limits) {
  Parser parser(lex_template(source, limits), limits);
  std::unique_ptr<Program> prog = parser.run();
  ScopeAnalysis().run(*prog);
  return prog;
}

}  // namespace ingot::tmpl::detail
