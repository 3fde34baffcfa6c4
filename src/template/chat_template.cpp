// Public interface of the chat template engine (chat_template.h): parsing a template once,
// rendering it over a JSON context, and choosing among a tokenizer config's named templates.
// The engine itself is template_lex/parse.cpp (source to syntax tree), template_value.cpp
// (Python values), template_interp/call/filters.cpp (the interpreter) and template_pystr.cpp
// (Python's str semantics). Hand-written, as the whole Jinja subset is: Debian packages no C++
// Jinja implementation (see chat_template.h).
#include "template/chat_template.h"

#include <stdexcept>

#include "core/error.h"
#include "template/template_interp.h"

namespace ingot::tmpl {

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
