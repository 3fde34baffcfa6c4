// Renders Hugging Face chat templates (the Jinja2 `chat_template` of tokenizer_config.json or
// chat_template.jinja) the way transformers' apply_chat_template does, byte for byte.
//
// Hand-written: Debian packages no C++ Jinja implementation, so this is a sandboxed subset of the
// Jinja2 language written for this project (lexer, parser and tree-walking interpreter under
// src/template/). It follows the environment transformers builds: trim_blocks and lstrip_blocks
// on, keep_trailing_newline off, the loopcontrols extension (break/continue), the `generation`
// block tag, a `tojson` filter that is Python's json.dumps(ensure_ascii=False, sort_keys=False),
// and the globals raise_exception() and strftime_now(). Values follow Python semantics (str(),
// repr(), float formatting, truthiness, comparisons). docs/chat-templates.md lists the subset.
//
// Sandbox: templates cannot read files or the environment; loop iterations, evaluation steps,
// macro call depth, nesting depth and output size are bounded (Limits), so every render ends.
// Anything outside the subset is an ingot::Error naming the template line and the construct,
// raised when the template is parsed where possible (unknown tags, filters and tests) and
// otherwise when it is rendered (unknown methods, type errors).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace ingot::tmpl {

struct Limits {
  std::size_t max_output_bytes = 64u << 20;    // rendered text, and any one string or list built
  std::uint64_t max_loop_iterations = 1000000;  // all for-loop iterations of one render together
  std::uint64_t max_steps = 50000000;           // expression and statement evaluations per render
  int max_call_depth = 32;                      // nested macro calls
  int max_nesting = 100;                         // nested brackets / blocks in the template source
  std::size_t max_source_bytes = 4u << 20;      // template text
};

namespace detail {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template once. Throws ingot::Error("chat template line N: ...") on a syntax error or
  // an unsupported construct.
  explicit ChatTemplate(std::string source, Limits limits = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // context holds the template's variables, e.g. {"messages": [...], "tools": [...] or null,
  // "add_generation_prompt": bool, "enable_thinking": bool (optional), "bos_token": "...",
  // "eos_token": "...", plus any extra keyword arguments}. It must be an *ordered* json object:
  // key order is observable (tojson, dict iteration) and transformers keeps insertion order.
  // For parity with apply_chat_template, pass "tools": null and "documents": null when absent
  // (transformers always defines both) and omit enable_thinking unless the caller set it.
  // Throws ingot::Error naming the line on any failure, including raise_exception(msg).
  std::string render(const nlohmann::ordered_json& context) const;

  const Limits& limits() const { return limits_; }

 private:
  std::unique_ptr<detail::Program> program_;
  Limits limits_;
};

// The template text from tokenizer_config.json's "chat_template" field, chosen as transformers
// does: a string is the template; a list of {"name": ..., "template": ...} entries gives
// "tool_use" when tools are passed and that entry exists, else "default". Throws ingot::Error
// naming `where` (e.g. the file) when the field is missing, malformed or has no usable entry.
std::string select_chat_template(const nlohmann::json& field, bool has_tools, const std::string& where);

}  // namespace ingot::tmpl
