#include "server/output.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ingot::server {

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

constexpr std::string_view kFunctionOpen = "<function=", kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=", kParamClose = "</parameter>";

using ojson = nlohmann::ordered_json;

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// JSON text of a value whose strings may hold bytes that are not UTF-8 (a model can write any).
std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// The JSON form: {"name": ..., "arguments": {...}} (arguments may also be given as JSON text).
bool parse_json_call(std::string_view body, ToolCall& out) {
  const ojson j = ojson::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out.name = j["name"].get<std::string>();
  const ojson args = j.value("arguments", ojson::object());
  out.arguments = args.is_string() ? args.get<std::string>() : dump(args);
  return true;
}

// "<TAG=NAME>" at the start of s: NAME (one line, no markup), s moved past the '>'.
bool take_open_tag(std::string_view& s, std::string_view tag, std::string& name) {
  if (s.substr(0, tag.size()) != tag) return false;
  const size_t end = s.find('>', tag.size());
  if (end == std::string_view::npos) return false;
  const std::string_view n = s.substr(tag.size(), end - tag.size());
  if (trim(n).empty() || n.find_first_of("<\n") != std::string_view::npos) return false;
  name = std::string(n);
  s.remove_prefix(end + 1);
  return true;
}

// The schema of a tool's parameter in OpenAI's tool list, or null.
const ojson& parameter_schema(const ojson& tools, const std::string& function, const std::string& param) {
  static const ojson none;
  if (!tools.is_array()) return none;
  for (const ojson& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const ojson& f = t["function"];
    if (!f.contains("name") || f["name"] != function) continue;
    if (!f.contains("parameters") || !f["parameters"].is_object()) return none;
    const ojson& params = f["parameters"];
    if (!params.contains("properties") || !params["properties"].is_object()) return none;
    const ojson& props = params["properties"];
    return props.contains(param) ? props[param] : none;
  }
  return none;
}

// The XML form, as the Qwen3.5 template writes a call (and teaches the model to):
//   <function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>
bool parse_xml_call(std::string_view body, const ojson& tools, ToolCall& out) {
  body = trim(body);
  std::string name;
  if (!take_open_tag(body, kFunctionOpen, name)) return false;
  if (body.size() < kFunctionClose.size() || body.substr(body.size() - kFunctionClose.size()) != kFunctionClose)
    return false;
  body.remove_suffix(kFunctionClose.size());
  ojson args = ojson::object();
  for (;;) {
    body = trim(body);
    if (body.empty()) break;
    std::string param;
    if (!take_open_tag(body, kParamOpen, param)) return false;
    const size_t end = body.find(kParamClose);
    if (end == std::string_view::npos) return false;
    std::string_view value = body.substr(0, end);
    // The template puts the value on lines of its own: one newline after the tag and one before the
    // closing tag are markup, the rest (inner blank lines, indentation) is the value.
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    args[param] = tool_parameter_value(value, parameter_schema(tools, name, param));
    body.remove_prefix(end + kParamClose.size());
  }
  out.name = std::move(name);
  out.arguments = dump(args);
  return true;
}

// Whether a decoded value is of a type the schema's "type" (a name or a list of names) allows.
bool schema_allows(const ojson& types, const ojson& v) {
  auto has = [&](const char* t) {
    if (types.is_string()) return types == t;
    for (const ojson& x : types)
      if (x == t) return true;
    return false;
  };
  if (v.is_boolean()) return has("boolean");
  if (v.is_number_integer()) return has("integer") || has("number");
  if (v.is_number()) return has("number");
  if (v.is_object()) return has("object");
  if (v.is_array()) return has("array");
  if (v.is_null()) return has("null");
  return false;
}

}  // namespace

ojson tool_parameter_value(std::string_view text, const ojson& schema) {
  const ojson decoded = ojson::parse(text, nullptr, false);
  const bool json_value = !decoded.is_discarded() && !decoded.is_string();
  const ojson* types = schema.is_object() && schema.contains("type") ? &schema["type"] : nullptr;
  if (!types || !(types->is_string() || types->is_array()))  // undeclared, or a schema without a type
    return json_value ? decoded : ojson(std::string(text));
  if (json_value && schema_allows(*types, decoded)) return decoded;
  // The template writes a history's Python values with str(): True, False, None.
  const std::string_view t = trim(text);
  if ((t == "True" || t == "False") && schema_allows(*types, ojson(true))) return t == "True";
  if (t == "None" && schema_allows(*types, ojson(nullptr))) return nullptr;
  return std::string(text);
}

bool parse_tool_calls(std::string_view text, const ojson& tools, std::vector<ToolCall>& out) {
  std::vector<ToolCall> calls;
  size_t at = 0;
  for (;;) {
    while (at < text.size() && is_space(text[at])) ++at;
    if (at == text.size()) break;
    if (text.substr(at, kToolOpen.size()) != kToolOpen) return false;
    const size_t body = at + kToolOpen.size();
    const size_t end = text.find(kToolClose, body);
    if (end == std::string_view::npos) return false;
    const std::string_view inner = text.substr(body, end - body);
    ToolCall c;
    const bool ok = trim(inner).substr(0, kFunctionOpen.size()) == kFunctionOpen ? parse_xml_call(inner, tools, c)
                                                                                  : parse_json_call(inner, c);
    if (!ok) return false;
    calls.push_back(std::move(c));
    at = end + kToolClose.size();
  }
  if (calls.empty()) return false;
  out = std::move(calls);
  return true;
}


OutputParser::OutputParser(bool reasoning, bool starts_in_reasoning, const ojson& tools)
    : reasoning_(reasoning),
      tools_(!tools.is_null()),
      tool_defs_(tools),
      mode_(reasoning && starts_in_reasoning ? Mode::Reasoning : Mode::Content) {
  if (mode_ == Mode::Reasoning) think_seen_ = true;
}

OutputParser::OutputParser(bool reasoning, bool starts_in_reasoning, bool tools)
    : OutputParser(reasoning, starts_in_reasoning, tools ? ojson::array() : ojson()) {}

void OutputParser::emit(TextDelta& d, std::string_view text) {
  if (text.empty()) return;
  if (mode_ == Mode::Reasoning) {
    d.reasoning += text;
    return;
  }
  if (trim_leading_) {
    size_t a = 0;
    while (a < text.size() && is_space(text[a])) ++a;
    text.remove_prefix(a);
    if (text.empty()) return;
    trim_leading_ = false;
  }
  d.content += text;
}

TextDelta OutputParser::push(std::string_view text) {
  TextDelta d;
  if (mode_ == Mode::Tools) {
    tool_text_ += text;
    return d;
  }
  pending_ += text;
  for (;;) {
    if (mode_ == Mode::Reasoning) {
      const size_t at = pending_.find(kThinkClose);
      if (at == std::string::npos) break;
      emit(d, std::string_view(pending_).substr(0, at));
      pending_.erase(0, at + kThinkClose.size());
      mode_ = Mode::Content;
      trim_leading_ = true;
      continue;
    }
    // Content: the earlier of an opening <think> (once) and a <tool_call>.
    const size_t think = reasoning_ && !think_seen_ ? pending_.find(kThinkOpen) : std::string::npos;
    const size_t tool = tools_ ? pending_.find(kToolOpen) : std::string::npos;
    if (think == std::string::npos && tool == std::string::npos) break;
    if (think < tool) {
      emit(d, std::string_view(pending_).substr(0, think));
      pending_.erase(0, think + kThinkOpen.size());
      mode_ = Mode::Reasoning;
      think_seen_ = true;
      continue;
    }
    emit(d, std::string_view(pending_).substr(0, tool));
    tool_text_ = pending_.substr(tool);
    pending_.clear();
    mode_ = Mode::Tools;
    return d;
  }
  size_t hold = 0;
  if (mode_ == Mode::Reasoning) hold = partial_tag(pending_, kThinkClose);
  else {
    if (reasoning_ && !think_seen_) hold = partial_tag(pending_, kThinkOpen);
    if (tools_) hold = std::max(hold, partial_tag(pending_, kToolOpen));
  }
  emit(d, std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return d;
}

TextDelta OutputParser::finish() {
  TextDelta d;
  if (mode_ == Mode::Tools) {
    if (!parse_tool_calls(tool_text_, tool_defs_, calls_)) {
      mode_ = Mode::Content;
      emit(d, tool_text_);
    }
    tool_text_.clear();
    return d;
  }
  emit(d, pending_);
  pending_.clear();
  return d;
}

}  // namespace ingot::server
