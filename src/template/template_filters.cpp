// Filters and tests of the chat template engine (`x | trim`, `x is defined`): each is a function
// of its own, found by name in a table sorted by name. The parser asks the same tables which
// names exist, so a template naming anything else is rejected before it renders. Arguments,
// defaults and errors follow Jinja2's filters and tests as transformers' environment has them.
// Hand-written, as the whole Jinja subset is: Debian packages no C++ Jinja implementation (see
// chat_template.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <string_view>

#include "template/template_interp.h"
#include "template/template_pystr.h"

namespace ingot::tmpl::detail {
namespace {

template <typename Fn>
struct Named {
  std::string_view name;
  Fn fn;
};

template <typename Fn, std::size_t N>
constexpr bool sorted_by_name(const Named<Fn> (&table)[N]) {
  for (std::size_t k = 1; k < N; ++k)
    if (!(table[k - 1].name < table[k].name)) return false;
  return true;
}

template <typename Fn, std::size_t N>
const Fn* find_named(const Named<Fn> (&table)[N], std::string_view name) {
  const auto* it = std::lower_bound(std::begin(table), std::end(table), name,
                                    [](const Named<Fn>& e, std::string_view n) { return e.name < n; });
  return it != std::end(table) && it->name == name ? &it->fn : nullptr;
}

// --- filters ------------------------------------------------------------------------------------

// One application of a filter; several names may share a function, so it carries the name used.
struct FilterCall {
  Interp& in;
  const std::string& name;
  const Value& v;
  const Args& a;
  int line;

  // Python str(x): string filters coerce their input, as Jinja's do.
  std::string text(const Value& x) const { return in.text_of(x); }
  // A boolean argument by position or keyword: its truthiness, or dflt when absent.
  bool flag(std::size_t k, const char* kw, bool dflt) const {
    const Value* x = a.get(k, kw);
    return x ? truthy(*x) : dflt;
  }
};
using FilterFn = Value (*)(const FilterCall&);

// Jinja's attribute getter: "a.b.0" walks items and attributes; digit parts are indexes.
Value attr_path(const Interp& in, const Value& item, const std::string& path, int line) {
  Value cur = item;
  std::size_t start = 0;
  for (;;) {
    std::size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (cur.is_undefined()) undefined_error(cur, line);
    cur = digits && part.size() < 18 ? in.get_item(cur, Value::integer(std::stoll(part)), line)
                                     : in.get_item(cur, Value::string(part), line);
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// The attribute path argument of a filter (an integer is an index), as a string.
std::string attr_arg(const Args& a, std::size_t k, const char* kw, int line) {
  const Value* v = a.get(k, kw);
  if (!v) fail(line, std::string("filter needs the '") + kw + "' argument");
  if (v->is_integral()) return std::to_string(v->as_int());
  if (!v->is_string()) fail(line, std::string("the '") + kw + "' argument must be a string");
  return v->str();
}

// Sort key for sort/unique/min/max/dictsort: strings compare case-insensitively unless asked.
Value fold_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(map_chars(v.str(), to_lower));
  return v;
}

using Keyed = std::vector<std::pair<Value, Value>>;  // (sort key, item)

void stable_sort_values(const Interp& in, Keyed& keyed, bool reverse, int line) {
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    int c = reverse ? in.order(y.first, x.first, "<", line) : in.order(x.first, y.first, "<", line);
    return c == -1;
  });
}

List sorted_items(Keyed& keyed) {
  List out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return out;
}

// The items of sort/unique/min/max with their keys: the case_sensitive argument at case_pos and
// the attribute argument after it.
Keyed keyed_items(const FilterCall& c, std::size_t case_pos) {
  bool case_sensitive = c.flag(case_pos, "case_sensitive", false);
  const Value* attr = c.a.get(case_pos + 1, "attribute");
  std::string path = attr && !attr->is_none() ? attr_arg(c.a, case_pos + 1, "attribute", c.line) : "";
  Keyed keyed;
  for (const Value& item : c.in.iterate(c.v, c.line)) {
    c.in.step(c.line);
    keyed.emplace_back(fold_case(path.empty() ? item : attr_path(c.in, item, path, c.line), case_sensitive), item);
  }
  return keyed;
}

Value filter_tojson(const FilterCall& c) {
  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonOptions opt;
  opt.limit = c.in.limits().max_output_bytes;
  opt.ensure_ascii = c.flag(0, "ensure_ascii", false);
  const Value* indent = c.a.get(1, "indent");
  if (indent && !indent->is_none()) {
    opt.has_indent = true;
    if (indent->is_integral())
      opt.indent = std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(indent->as_int(), 0, 64)), ' ');
    else if (indent->is_string())
      opt.indent = indent->str();
    else
      fail(c.line, "tojson: indent must be an integer or a string");
    opt.item_sep = ",";
  }
  const Value* seps = c.a.get(2, "separators");
  if (seps && !seps->is_none()) {
    if (seps->type != Type::List || seps->list->size() != 2 || !(*seps->list)[0].is_string() || !(*seps->list)[1].is_string())
      fail(c.line, "tojson: separators must be a pair of strings");
    opt.item_sep = (*seps->list)[0].str();
    opt.key_sep = (*seps->list)[1].str();
  }
  opt.sort_keys = c.flag(3, "sort_keys", false);
  for (const auto& [k, x] : c.a.kw)
    if (k != "ensure_ascii" && k != "indent" && k != "separators" && k != "sort_keys")
      fail(c.line, "tojson() got an unexpected keyword argument '" + k + "'");
  if (c.v.is_undefined()) fail(c.line, "tojson: Object of type Undefined is not JSON serializable");
  return c.in.str_value(to_json(c.v, opt), c.line);
}

Value filter_trim(const FilterCall& c) {
  return Value::string(py_strip(c.text(c.v), c.a.get(0, "chars"), true, true)).with_markup_of(c.v);
}

Value filter_length(const FilterCall& c) {
  const Value& v = c.v;
  switch (v.type) {
    case Type::Undefined: return Value::integer(0);
    case Type::String: return Value::integer(static_cast<std::int64_t>(utf8_length(v.str())));
    case Type::List:
      if (v.seq != SeqKind::Iterator) return Value::integer(static_cast<std::int64_t>(v.list->size()));
      break;
    case Type::Dict: return Value::integer(static_cast<std::int64_t>(v.dict->entries.size()));
    default: break;
  }
  fail(c.line, std::string("TypeError: object of type '") + type_name(v) + "' has no len()");
}

Value filter_string(const FilterCall& c) { return Value::string(c.text(c.v)).with_markup_of(c.v); }
// Markup(str(value)): whatever it was, it is now a string marked safe.
Value filter_safe(const FilterCall& c) {
  Value r = Value::string(c.text(c.v));
  r.markup = true;
  return r;
}
Value filter_lower(const FilterCall& c) { return Value::string(map_chars(c.text(c.v), to_lower)).with_markup_of(c.v); }
Value filter_upper(const FilterCall& c) { return Value::string(map_chars(c.text(c.v), to_upper)).with_markup_of(c.v); }
Value filter_capitalize(const FilterCall& c) { return Value::string(py_capitalize(c.text(c.v))).with_markup_of(c.v); }
Value filter_title(const FilterCall& c) { return Value::string(jinja_title(c.text(c.v))).with_markup_of(c.v); }

Value first_or_last(const FilterCall& c, bool last) {
  if (last && c.v.type == Type::List && c.v.seq == SeqKind::Iterator)
    fail(c.line, "TypeError: the last item of a generator is not available; apply |list first");
  List items = c.in.iterate(c.v, c.line);
  if (items.empty()) return Value::undefined("No " + c.name + " item, sequence was empty.");
  return last ? items.back() : items.front();
}
Value filter_first(const FilterCall& c) { return first_or_last(c, false); }
Value filter_last(const FilterCall& c) { return first_or_last(c, true); }

Value filter_join(const FilterCall& c) {
  const Value* sep = c.a.get(0, "d");
  const Value* attr = c.a.get(1, "attribute");
  std::string d = sep ? c.text(*sep) : "";
  std::string out;
  List items = c.in.iterate(c.v, c.line);
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (k) out += d;
    out += c.text(attr && !attr->is_none() ? attr_path(c.in, items[k], attr_arg(c.a, 1, "attribute", c.line), c.line)
                                           : items[k]);
    c.in.check_len(out.size(), c.line);
  }
  return Value::string(std::move(out));
}

Value filter_replace(const FilterCall& c) {
  const Value* old = c.a.get(0, "old");
  const Value* repl = c.a.get(1, "new");
  if (!old || !repl) fail(c.line, "replace filter takes old and new");
  std::int64_t count = int_arg(c.a.get(2, "count"), -1, "count", c.line);
  return c.in.str_value(py_replace(c.text(c.v), c.text(*old), c.text(*repl), count, c.in.limits().max_output_bytes),
                        c.line);
}

Value filter_default(const FilterCall& c) {
  const Value* dflt = c.a.get(0, "default_value");
  bool boolean = c.flag(1, "boolean", false);
  if (c.v.is_undefined() || (boolean && !truthy(c.v))) return dflt ? *dflt : Value::string("");
  return c.v;
}

Value filter_items(const FilterCall& c) {
  if (c.v.is_undefined()) return Value::sequence({}, SeqKind::Iterator);
  if (c.v.type != Type::Dict) fail(c.line, "TypeError: can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : c.v.dict->entries) out.push_back(Value::sequence({Value::string(k), x}, SeqKind::Tuple));
  return Value::sequence(std::move(out), SeqKind::Iterator);
}

Value filter_list(const FilterCall& c) { return Value::sequence(c.in.iterate(c.v, c.line)); }

// select/reject (the item passes a test) and selectattr/rejectattr (an attribute of it does);
// want is what the test must answer for the item to be kept.
Value matching(const FilterCall& c, bool by_attr, bool want) {
  std::size_t test_pos = by_attr ? 1 : 0;
  std::string attr = by_attr ? attr_arg(c.a, 0, "attribute", c.line) : "";
  std::string test;
  if (c.a.pos.size() > test_pos) {
    if (!c.a.pos[test_pos].is_string()) fail(c.line, c.name + ": the test name must be a string");
    test = c.a.pos[test_pos].str();
    if (!is_known_test(test)) fail(c.line, "unsupported construct: test '" + test + "'");
  }
  Args test_args;
  for (std::size_t k = test_pos + 1; k < c.a.pos.size(); ++k) test_args.pos.push_back(c.a.pos[k]);
  test_args.kw = c.a.kw;
  List out;
  // Jinja yields nothing for a false value (None, empty) without iterating it.
  for (const Value& item : truthy(c.v) ? c.in.iterate(c.v, c.line) : List{}) {
    c.in.step(c.line);
    Value subject = by_attr ? attr_path(c.in, item, attr, c.line) : item;
    bool r = test.empty() ? truthy(subject) : c.in.apply_test(test, subject, test_args, c.line);
    if (r == want) out.push_back(item);
  }
  return Value::sequence(std::move(out), SeqKind::Iterator);
}
Value filter_select(const FilterCall& c) { return matching(c, false, true); }
Value filter_reject(const FilterCall& c) { return matching(c, false, false); }
Value filter_selectattr(const FilterCall& c) { return matching(c, true, true); }
Value filter_rejectattr(const FilterCall& c) { return matching(c, true, false); }

Value filter_map(const FilterCall& c) {
  List out;
  const Value* attr = nullptr;
  for (const auto& [k, x] : c.a.kw)
    if (k == "attribute") attr = &x;
  if (attr) {
    const Value* dflt = nullptr;
    for (const auto& [k, x] : c.a.kw)
      if (k == "default") dflt = &x;
      else if (k != "attribute") fail(c.line, "map() got an unexpected keyword argument '" + k + "'");
    Args tmp;
    tmp.kw.emplace_back("attribute", *attr);
    std::string path = attr_arg(tmp, 0, "attribute", c.line);
    for (const Value& item : truthy(c.v) ? c.in.iterate(c.v, c.line) : List{}) {
      c.in.step(c.line);
      Value r = attr_path(c.in, item, path, c.line);
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
  } else {
    if (c.a.pos.empty() || !c.a.pos[0].is_string()) fail(c.line, "map() needs a filter name or attribute=");
    std::string filter = c.a.pos[0].str();
    if (!is_known_filter(filter)) fail(c.line, "unsupported construct: filter '" + filter + "'");
    Args fargs;
    fargs.pos.assign(c.a.pos.begin() + 1, c.a.pos.end());
    fargs.kw = c.a.kw;
    for (const Value& item : truthy(c.v) ? c.in.iterate(c.v, c.line) : List{}) {
      c.in.step(c.line);
      out.push_back(c.in.apply_filter(filter, item, fargs, c.line));
    }
  }
  return Value::sequence(std::move(out), SeqKind::Iterator);
}

Value filter_int(const FilterCall& c) {
  const Value& v = c.v;
  if (v.is_undefined()) undefined_error(v, c.line);
  std::int64_t dflt = int_arg(c.a.get(0, "default"), 0, "default", c.line);
  const Value* base = c.a.get(1, "base");
  if (base && !(base->is_integral() && base->as_int() == 10))
    fail(c.line, "unsupported construct: int filter with a base other than 10");
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.type == Type::Float) {
    if (!std::isfinite(v.f)) fail(c.line, "OverflowError: cannot convert float infinity or NaN to integer");
    if (std::fabs(v.f) >= 9.2e18) fail(c.line, "int: value out of the 64-bit range");
    return Value::integer(static_cast<std::int64_t>(v.f));
  }
  if (v.is_string()) {
    std::int64_t r;
    if (parse_py_int(v.str(), &r)) return Value::integer(r);
    double d;
    if (parse_py_float(v.str(), &d)) {
      if (!std::isfinite(d)) fail(c.line, "OverflowError: cannot convert float infinity or NaN to integer");
      if (std::fabs(d) >= 9.2e18) fail(c.line, "int: value out of the 64-bit range");
      return Value::integer(static_cast<std::int64_t>(d));
    }
  }
  return Value::integer(dflt);
}

Value filter_float(const FilterCall& c) {
  if (c.v.is_undefined()) undefined_error(c.v, c.line);
  const Value* dflt = c.a.get(0, "default");
  if (c.v.is_number()) return Value::number(c.v.as_double());
  double d;
  if (c.v.is_string() && parse_py_float(c.v.str(), &d)) return Value::number(d);
  return dflt ? *dflt : Value::number(0.0);
}

Value filter_round(const FilterCall& c) {
  const Value& v = c.v;
  std::int64_t precision = int_arg(c.a.get(0, "precision"), 0, "precision", c.line);
  const Value* method = c.a.get(1, "method");
  std::string m = method ? c.text(*method) : "common";
  if (m != "common" && m != "ceil" && m != "floor") fail(c.line, "round: method must be common, ceil or floor");
  if (!v.is_number()) fail(c.line, std::string("TypeError: type ") + type_name(v) + " doesn't define __round__ method");
  if (m == "common") {
    if (v.is_integral() && precision >= 0) return Value::integer(v.as_int());
    if (v.is_integral()) fail(c.line, "round: negative precision is not supported");
    return Value::number(py_round(v.f, precision));
  }
  if (precision < 0 || precision > 300) fail(c.line, "round: precision out of range");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  return Value::number((m == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value filter_abs(const FilterCall& c) {
  if (c.v.type == Type::Float) return Value::number(std::fabs(c.v.f));
  if (c.v.is_integral()) {
    if (c.v.as_int() == INT64_MIN) fail(c.line, "integer overflow");
    return Value::integer(std::llabs(c.v.as_int()));
  }
  fail(c.line, std::string("TypeError: bad operand type for abs(): '") + type_name(c.v) + "'");
}

Value filter_sort(const FilterCall& c) {
  bool reverse = c.flag(0, "reverse", false);
  Keyed keyed = keyed_items(c, 1);
  stable_sort_values(c.in, keyed, reverse, c.line);
  return Value::sequence(sorted_items(keyed));
}

Value filter_unique(const FilterCall& c) {
  List out;
  std::vector<Value> seen;
  for (auto& [k, item] : keyed_items(c, 0)) {
    // Jinja collects seen keys in a set, so unhashable items fail as in Python.
    if ((k.type == Type::List && k.seq != SeqKind::Tuple) || k.type == Type::Dict || k.type == Type::Namespace)
      fail(c.line, std::string("TypeError: unhashable type: '") + type_name(k) + "'");
    bool dup = false;
    for (const Value& s : seen) dup = dup || equals(s, k);
    if (dup) continue;
    seen.push_back(k);
    out.push_back(item);
    c.in.step(c.line);
  }
  return Value::sequence(std::move(out), SeqKind::Iterator);
}

// The first item whose key is greatest (max) or least (min).
Value extreme(const FilterCall& c, bool max) {
  Keyed keyed = keyed_items(c, 0);
  if (keyed.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  std::size_t best = 0;
  for (std::size_t k = 1; k < keyed.size(); ++k) {
    int o = c.in.order(keyed[k].first, keyed[best].first, "<", c.line);
    if (max ? o == 1 : o == -1) best = k;
  }
  return keyed[best].second;
}
Value filter_max(const FilterCall& c) { return extreme(c, true); }
Value filter_min(const FilterCall& c) { return extreme(c, false); }

Value filter_reverse(const FilterCall& c) {
  if (c.v.is_string()) {
    std::vector<char32_t> cps = decode_utf8(c.v.str());
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode_utf8(cps, 0, cps.size()));
  }
  bool from_iterator = c.v.type == Type::List && c.v.seq == SeqKind::Iterator;
  List items = c.in.iterate(c.v, c.line);
  std::reverse(items.begin(), items.end());
  return Value::sequence(std::move(items), from_iterator ? SeqKind::List : SeqKind::Iterator);
}

Value filter_sum(const FilterCall& c) {
  const Value* attr = c.a.get(0, "attribute");
  const Value* start = c.a.get(1, "start");
  Value acc = start ? *start : Value::integer(0);
  std::string path = attr && !attr->is_none() ? attr_arg(c.a, 0, "attribute", c.line) : "";
  for (const Value& item : c.in.iterate(c.v, c.line)) {
    c.in.step(c.line);
    acc = c.in.binary("+", acc, path.empty() ? item : attr_path(c.in, item, path, c.line), c.line);
  }
  return acc;
}

Value filter_dictsort(const FilterCall& c) {
  if (c.v.type != Type::Dict) fail(c.line, "dictsort: argument must be a dict");
  bool case_sensitive = c.flag(0, "case_sensitive", false);
  const Value* by = c.a.get(1, "by");
  std::string by_s = by ? c.text(*by) : "key";
  if (by_s != "key" && by_s != "value") fail(c.line, "dictsort: 'by' must be 'key' or 'value'");
  bool reverse = c.flag(2, "reverse", false);
  Keyed keyed;
  for (const auto& [k, x] : c.v.dict->entries)
    keyed.emplace_back(fold_case(by_s == "key" ? Value::string(k) : x, case_sensitive),
                       Value::sequence({Value::string(k), x}, SeqKind::Tuple));
  stable_sort_values(c.in, keyed, reverse, c.line);
  return Value::sequence(sorted_items(keyed));
}

Value filter_center(const FilterCall& c) {
  std::int64_t width = int_arg(c.a.get(0, "width"), 80, "width", c.line);
  std::string s = c.text(c.v);
  auto len = static_cast<std::int64_t>(utf8_length(s));
  if (width <= len) return Value::string(s);
  c.in.check_len(static_cast<std::size_t>(width), c.line);
  std::int64_t marg = width - len;
  std::int64_t left = marg / 2 + (marg & width & 1);
  return Value::string(std::string(static_cast<std::size_t>(left), ' ') + s +
                       std::string(static_cast<std::size_t>(marg - left), ' '));
}

Value filter_indent(const FilterCall& c) {
  const Value* w = c.a.get(0, "width");
  std::string ind;
  if (w && w->is_string())
    ind = w->str();
  else
    ind = std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(int_arg(w, 4, "width", c.line), 0, 256)), ' ');
  bool first = c.flag(1, "first", false);
  bool blank = c.flag(2, "blank", false);
  if (c.v.is_undefined()) undefined_error(c.v, c.line);
  if (!c.v.is_string())
    fail(c.line, std::string("TypeError: unsupported operand type(s) for +=: '") + type_name(c.v) + "' and 'str'");
  std::vector<std::string> lines = py_splitlines(c.v.str() + "\n", false);
  std::string rv;
  if (blank) {
    for (std::size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ind;
      rv += lines[k];
      c.in.check_len(rv.size(), c.line);
    }
  } else if (!lines.empty()) {
    rv = lines[0];
    for (std::size_t k = 1; k < lines.size(); ++k) {
      rv += "\n";
      if (!lines[k].empty()) rv += ind;
      rv += lines[k];
      c.in.check_len(rv.size(), c.line);
    }
  }
  if (first) rv = ind + rv;
  return c.in.str_value(std::move(rv), c.line);
}

constexpr Named<FilterFn> kFilters[] = {
    {"abs", filter_abs},
    {"capitalize", filter_capitalize},
    {"center", filter_center},
    {"count", filter_length},
    {"d", filter_default},
    {"default", filter_default},
    {"dictsort", filter_dictsort},
    {"first", filter_first},
    {"float", filter_float},
    {"indent", filter_indent},
    {"int", filter_int},
    {"items", filter_items},
    {"join", filter_join},
    {"last", filter_last},
    {"length", filter_length},
    {"list", filter_list},
    {"lower", filter_lower},
    {"map", filter_map},
    {"max", filter_max},
    {"min", filter_min},
    {"reject", filter_reject},
    {"rejectattr", filter_rejectattr},
    {"replace", filter_replace},
    {"reverse", filter_reverse},
    {"round", filter_round},
    {"safe", filter_safe},
    {"select", filter_select},
    {"selectattr", filter_selectattr},
    {"sort", filter_sort},
    {"string", filter_string},
    {"sum", filter_sum},
    {"title", filter_title},
    {"tojson", filter_tojson},
    {"trim", filter_trim},
    {"unique", filter_unique},
    {"upper", filter_upper},
};
static_assert(sorted_by_name(kFilters), "kFilters is searched by bisection, so it must stay sorted by name");

// --- tests --------------------------------------------------------------------------------------

// One application of a test; arg is its first argument (`x is divisibleby 3`), if any.
struct TestCall {
  Interp& in;
  const std::string& name;
  const Value& v;
  const Value* arg;
  int line;

  const Value& need_arg() const {
    if (!arg) fail(line, "test '" + name + "' needs an argument");
    return *arg;
  }
};
using TestFn = bool (*)(const TestCall&);

bool remainder_is(const TestCall& t, const Value& divisor, std::int64_t r) {
  return equals(t.in.binary("%", t.v, divisor, t.line), Value::integer(r));
}

constexpr Named<TestFn> kTests[] = {
    {"boolean", [](const TestCall& t) { return t.v.type == Type::Bool; }},
    // Jinja's Undefined defines __call__ (to raise), so Python calls it callable.
    {"callable", [](const TestCall& t) { return t.v.type == Type::Function || t.v.is_undefined(); }},
    {"defined", [](const TestCall& t) { return !t.v.is_undefined(); }},
    {"divisibleby", [](const TestCall& t) { return remainder_is(t, t.need_arg(), 0); }},
    {"eq", [](const TestCall& t) { return equals(t.v, t.need_arg()); }},
    {"equalto", [](const TestCall& t) { return equals(t.v, t.need_arg()); }},
    {"even", [](const TestCall& t) { return remainder_is(t, Value::integer(2), 0); }},
    {"false", [](const TestCall& t) { return t.v.type == Type::Bool && !t.v.b; }},
    {"float", [](const TestCall& t) { return t.v.type == Type::Float; }},
    {"ge", [](const TestCall& t) { return t.in.compare(">=", t.v, t.need_arg(), t.line); }},
    {"greaterthan", [](const TestCall& t) { return t.in.compare(">", t.v, t.need_arg(), t.line); }},
    {"gt", [](const TestCall& t) { return t.in.compare(">", t.v, t.need_arg(), t.line); }},
    {"in", [](const TestCall& t) { return t.in.contains(t.need_arg(), t.v, t.line); }},
    {"integer", [](const TestCall& t) { return t.v.type == Type::Int; }},
    {"iterable",
     [](const TestCall& t) {
       return t.v.is_undefined() || t.v.is_string() || t.v.type == Type::List || t.v.type == Type::Dict;
     }},
    {"le", [](const TestCall& t) { return t.in.compare("<=", t.v, t.need_arg(), t.line); }},
    {"lessthan", [](const TestCall& t) { return t.in.compare("<", t.v, t.need_arg(), t.line); }},
    {"lower", [](const TestCall& t) { return py_is_case(t.in.text_of(t.v), false); }},
    {"lt", [](const TestCall& t) { return t.in.compare("<", t.v, t.need_arg(), t.line); }},
    {"mapping", [](const TestCall& t) { return t.v.type == Type::Dict; }},
    {"ne", [](const TestCall& t) { return !equals(t.v, t.need_arg()); }},
    {"none", [](const TestCall& t) { return t.v.is_none(); }},
    {"number", [](const TestCall& t) { return t.v.is_number(); }},
    {"odd", [](const TestCall& t) { return remainder_is(t, Value::integer(2), 1); }},
    // Undefined has __len__ and __getitem__, which is all Jinja's test looks for.
    {"sequence",
     [](const TestCall& t) {
       return t.v.is_undefined() || t.v.is_string() || t.v.type == Type::Dict ||
              (t.v.type == Type::List && (t.v.seq == SeqKind::List || t.v.seq == SeqKind::Tuple));
     }},
    {"string", [](const TestCall& t) { return t.v.is_string(); }},
    {"true", [](const TestCall& t) { return t.v.type == Type::Bool && t.v.b; }},
    {"undefined", [](const TestCall& t) { return t.v.is_undefined(); }},
    {"upper", [](const TestCall& t) { return py_is_case(t.in.text_of(t.v), true); }},
};
static_assert(sorted_by_name(kTests), "kTests is searched by bisection, so it must stay sorted by name");

}  // namespace

Value Interp::apply_filter(const std::string& name, const Value& v, const Args& a, int line) {
  const FilterFn* fn = find_named(kFilters, name);
  if (!fn) fail(line, "unsupported construct: filter '" + name + "'");
  return (*fn)(FilterCall{*this, name, v, a, line});
}

bool Interp::apply_test(const std::string& name, const Value& v, const Args& a, int line) {
  const TestFn* fn = find_named(kTests, name);
  if (!fn) fail(line, "unsupported construct: test '" + name + "'");
  return (*fn)(TestCall{*this, name, v, a.get(0, "other"), line});
}

bool is_known_filter(std::string_view name) { return find_named(kFilters, name) != nullptr; }
bool is_known_test(std::string_view name) { return find_named(kTests, name) != nullptr; }

}  // namespace ingot::tmpl::detail
