// Calls in the chat template interpreter: macros (with Jinja's argument binding and the call depth
// limit), the globals transformers provides (range, namespace, dict, raise_exception,
// strftime_now), loop.cycle, and the Python methods templates call on strings, dicts and lists.
// Hand-written, as the whole Jinja subset is: Debian packages no C++ Jinja implementation (see
// chat_template.h).
#include <algorithm>
#include <ctime>

#include "template/template_interp.h"
#include "template/template_pystr.h"

namespace ingot::tmpl::detail {

Value Interp::call(const Expr& e, const FramePtr& f) {
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

Value Interp::call_macro(const Callable& c, const Args& args, int line) {
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

Value Interp::call_global(const std::string& name, const Args& args, int line) {
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

Value Interp::call_method(const Value& self, const std::string& name, const Args& args, int line) {
  std::string qual = std::string(type_name(self)) + "." + name;
  auto str_arg = [&](std::size_t k, const char* kw) -> const Value* {
    const Value* v = args.get(k, kw);
    if (v && !v->is_string() && !v->is_none()) fail(line, qual + "() argument must be str, not " + type_name(*v));
    return v;
  };
  if (self.is_string()) {
    const std::string& s = self.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value::string(py_strip(s, str_arg(0, "chars"), name != "rstrip", name != "lstrip")).with_markup_of(self);
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
    if (name == "upper") return Value::string(map_chars(s, to_upper)).with_markup_of(self);
    if (name == "lower") return Value::string(map_chars(s, to_lower)).with_markup_of(self);
    if (name == "title") return Value::string(py_title(s)).with_markup_of(self);
    if (name == "capitalize") return Value::string(py_capitalize(s)).with_markup_of(self);
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

}  // namespace ingot::tmpl::detail
