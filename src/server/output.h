// A choice's generated text split the way OpenAI clients read it: `reasoning_content` (what a thinking
// model writes between <think> and </think>), `content`, and `tool_calls` parsed from the markup the
// chat templates teach inside <tool_call>...</tool_call>: a JSON object {"name": ..., "arguments": ...}
// (Qwen2.5/Qwen3, Hermes) or XML-style <function=NAME><parameter=ARG>VALUE</parameter></function>
// (Qwen3-Coder, Qwen3.5).
// Incremental, so streaming and whole responses split identically: text that could still be the start
// of a tag is held back until the next piece decides it. Tool-call markup is held to the end and parsed
// then; markup that does not parse is returned as content, never dropped.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ingot::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text, as OpenAI sends it
};

struct TextDelta {
  std::string reasoning, content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

// The tool calls of text that holds only <tool_call> blocks (and whitespace between them), or false
// (out untouched) when any part is not a well-formed call. tools: the request's tool definitions
// (OpenAI's list, or null); the XML form's values are typed by their parameter's JSON schema there:
// docs/serve.md, "Reasoning and tool calls", states the rule.
bool parse_tool_calls(std::string_view text, const nlohmann::ordered_json& tools, std::vector<ToolCall>& out);

// One XML-form parameter value typed by its schema (null when the tool or parameter is not declared).
nlohmann::ordered_json tool_parameter_value(std::string_view text, const nlohmann::ordered_json& schema);

class OutputParser {
 public:
  // reasoning: split <think>...</think>; starts_in_reasoning: the prompt already opened <think>
  // (templates that force thinking), so the text begins as reasoning. tools: the request's tool
  // definitions; null parses no tool calls.
  OutputParser(bool reasoning, bool starts_in_reasoning, const nlohmann::ordered_json& tools);
  // Tool calls without the tools' schemas: XML-form values are typed as for an undeclared parameter.
  OutputParser(bool reasoning, bool starts_in_reasoning, bool tools);
  TextDelta push(std::string_view text);
  // The rest, at the end of generation; tool calls become available.
  TextDelta finish();
  const std::vector<ToolCall>& tool_calls() const { return calls_; }

 private:
  enum class Mode { Content, Reasoning, Tools };
  void emit(TextDelta& d, std::string_view text);
  bool reasoning_, tools_;
  nlohmann::ordered_json tool_defs_;  // the schemas that type XML-form parameter values
  Mode mode_;
  bool think_seen_ = false;   // one reasoning block per reply
  bool trim_leading_ = false;  // drop the blank lines a model writes after </think>
  std::string pending_;       // text that may be the start of a tag
  std::string tool_text_;     // from the first <tool_call> on
  std::vector<ToolCall> calls_;
};

}  // namespace ingot::server
