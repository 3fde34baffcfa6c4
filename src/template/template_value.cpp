// Value model of the chat template engine: Python's str(), repr(), float formatting, json.dumps and
// equality, written here so rendered prompts match what Jinja2 under CPython prints, byte for byte.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <utf8proc.h>

#include "template/template_internal.h"

namespace ingot::tmpl::detail {

Value Value::undefined(std::string why) {
  Value v;
  v.s = std::make_shared<const std::string>(std::move(why));
  return v;
}
Value Value::none() {
  Value v;
  v.type = Type::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.type = Type::Bool;
  v.b = x;
  return v;
}
Value Value::integer(std::int64_t x) {
  Value v;
  v.type = Type::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.type = Type::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.type = Type::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::sequence(List items, SeqKind kind) {
  Value v;
  v.type = Type::List;
  v.seq = kind;
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::mapping(std::shared_ptr<Dict> d) {
  Value v;
  v.type = Type::Dict;
  v.dict = std::move(d);
  return v;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

const char* type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List:
      switch (v.seq) {
        case SeqKind::List: return "list";
        case SeqKind::Tuple: return "tuple";
        case SeqKind::Iterator: return "generator";
        case SeqKind::View: return "view";
      }
      return "list";
    case Type::Dict: return "dict";
    case Type::Namespace: return "Namespace";
    case Type::Function: return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return v.b;
    case Type::Int: return v.i != 0;
    case Type::Float: return v.f != 0.0;
    case Type::String: return !v.s->empty();
    case Type::List: return v.seq == SeqKind::Iterator || !v.list->empty();
    case Type::Dict: return !v.dict->entries.empty();
    case Type::Namespace:
    case Type::Function: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Type::Float || b.type == Type::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::Undefined:
    case Type::None: return true;
    case Type::String: return *a.s == *b.s;
    case Type::List: {
      bool a_tuple = a.seq == SeqKind::Tuple, b_tuple = b.seq == SeqKind::Tuple;
      if (a_tuple != b_tuple) return false;
      if (a.seq == SeqKind::Iterator || b.seq == SeqKind::Iterator) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Type::Dict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, v] : a.dict->entries) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Type::Namespace: return a.dict == b.dict;
    case Type::Function: return a.fn == b.fn;
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------------
// UTF-8

std::vector<char32_t> decode_utf8(std::string_view s) {
  // Strings come from JSON (valid UTF-8) or template literals (checked by the lexer); a stray
  // byte still decodes as U+FFFD rather than being skipped, so lengths stay honest.
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

void append_py_escape(std::string& out, char32_t c) {
  char b[16];
  if (c <= 0xFF)
    std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
  else if (c <= 0xFFFF)
    std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
  else
    std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
  out += b;
}

std::string encode_utf8(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end) {
  std::string out;
  out.reserve(end - begin);
  for (std::size_t k = begin; k < end; ++k) append_utf8(out, cps[k]);
  return out;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

bool py_isspace(char32_t c) {
  // CPython's str.isspace() set, which strip(), split() and the `\s` of Jinja's lexer use.
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Formatting

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, as CPython's repr uses, then CPython's layout: positional
  // notation when the decimal exponent is in [-4, 16), scientific with a 2-digit exponent otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  std::size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= static_cast<std::size_t>(exp) + 1) {
        out += digits;
        out.append(exp + 1 - digits.size(), '0');
        out += ".0";
      } else {
        out.append(digits, 0, exp + 1);
        out += '.';
        out.append(digits, exp + 1);
      }
    } else {
      out += "0.";
      out.append(static_cast<std::size_t>(-exp - 1), '0');
      out += digits;
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

std::string repr_string(const std::string& s) {
  std::vector<char32_t> cps = decode_utf8(s);
  bool has_single = false, has_double = false;
  for (char32_t c : cps) {
    has_single |= c == '\'';
    has_double |= c == '"';
  }
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : cps) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F || (c > 0x7F && !py_isprintable(c))) {
      append_py_escape(out, c);
    } else {
      append_utf8(out, c);
    }
  }
  out += quote;
  return out;
}

void require_printable_container(const Value& v) {
  if (v.type == Type::List && (v.seq == SeqKind::Iterator || v.seq == SeqKind::View))
    throw std::runtime_error(std::string("printing a ") + type_name(v) +
                             " object is not supported (CPython prints its address); apply |list first");
}

}  // namespace

namespace {

void check_limit(const std::string& out, std::size_t limit) {
  if (out.size() > limit)
    throw std::runtime_error("text of more than " + std::to_string(limit) + " bytes exceeds the output limit of " +
                             std::to_string(limit) + " bytes");
}

void repr_into(std::string& out, const Value& v, std::size_t limit) {
  switch (v.type) {
    case Type::String:
      if (v.markup) out += "Markup(" + repr_string(*v.s) + ")";
      else out += repr_string(*v.s);
      break;
    case Type::List: {
      require_printable_container(v);
      bool tuple = v.seq == SeqKind::Tuple;
      out += tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        repr_into(out, (*v.list)[k], limit);
        check_limit(out, limit);
      }
      if (tuple && v.list->size() == 1) out += ",";
      out += tuple ? ")" : "]";
      break;
    }
    case Type::Dict:
    case Type::Namespace: {
      out += v.type == Type::Dict ? "{" : "<Namespace {";
      bool first = true;
      for (const auto& [k, val] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k);
        out += ": ";
        repr_into(out, val, limit);
        check_limit(out, limit);
      }
      out += v.type == Type::Dict ? "}" : "}>";
      break;
    }
    case Type::Undefined: out += "Undefined"; break;
    default: out += to_str(v, limit); break;
  }
  check_limit(out, limit);
}

}  // namespace

std::string repr(const Value& v, std::size_t limit) {
  std::string out;
  repr_into(out, v, limit);
  return out;
}

std::string to_str(const Value& v, std::size_t limit) {
  switch (v.type) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return v.b ? "True" : "False";
    case Type::Int: return std::to_string(v.i);
    case Type::Float: return py_float_repr(v.f);
    case Type::String: return *v.s;
    case Type::Function:
      throw std::runtime_error("printing a function object is not supported (CPython prints its address)");
    default: return repr(v, limit);
  }
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  auto escape_u = [&](unsigned c) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", c);
    out += b;
  };
  if (!ensure_ascii) {
    for (unsigned char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20)
            escape_u(c);
          else
            out += static_cast<char>(c);
      }
    }
  } else {
    for (char32_t c : decode_utf8(s)) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || (c >= 0x7F && c <= 0xFFFF)) {
            escape_u(static_cast<unsigned>(c));
          } else if (c > 0xFFFF) {
            char32_t u = c - 0x10000;
            escape_u(0xD800 + static_cast<unsigned>(u >> 10));
            escape_u(0xDC00 + static_cast<unsigned>(u & 0x3FF));
          } else {
            out += static_cast<char>(c);
          }
      }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonOptions& opt, int level) {
  check_limit(out, opt.limit);
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += opt.indent;
  };
  switch (v.type) {
    case Type::None: out += "null"; return;
    case Type::Bool: out += v.b ? "true" : "false"; return;
    case Type::Int: out += std::to_string(v.i); return;
    case Type::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(v.f);
      return;
    case Type::String: json_string(out, *v.s, opt.ensure_ascii); return;
    case Type::List:
      if (v.seq == SeqKind::List || v.seq == SeqKind::Tuple) {
        if (v.list->empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (std::size_t k = 0; k < v.list->size(); ++k) {
          if (k) out += opt.item_sep;
          if (opt.has_indent) newline(level + 1);
          json_value(out, (*v.list)[k], opt, level + 1);
          check_limit(out, opt.limit);
        }
        if (opt.has_indent) newline(level);
        out += ']';
        return;
      }
      break;
    case Type::Dict: {
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : v.dict->entries) items.push_back(&e);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* e : items) {
        if (!first) out += opt.item_sep;
        first = false;
        if (opt.has_indent) newline(level + 1);
        json_string(out, e->first, opt.ensure_ascii);
        out += opt.key_sep;
        json_value(out, e->second, opt, level + 1);
        check_limit(out, opt.limit);
      }
      if (opt.has_indent) newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  throw std::runtime_error(std::string("tojson: Object of type ") + type_name(v) + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0);
  check_limit(out, opt.limit);
  return out;
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 512) throw std::runtime_error("value nested deeper than 512 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX))
        throw std::runtime_error("integer " + std::to_string(u) + " in the context is out of the 64-bit range");
      return Value::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::sequence(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (const auto& [k, e] : j.items()) d->set(k, from_json(e, depth + 1));
      return Value::mapping(std::move(d));
    }
    default: throw std::runtime_error("the context holds a value JSON cannot express (binary)");
  }
}

}  // namespace ingot::tmpl::detail
