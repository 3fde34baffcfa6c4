// A choice's generated text split the way OpenAI clients read it: `reasoning_content` (what a thinking
// model writes between <think> and </think>), `content`, and `tool_calls` parsed from the
// <tool_call>{"name": ..., "arguments": ...}</tool_call> markup that Qwen/Hermes-style templates teach.
// Incremental, so streaming and whole responses split identically: text that could still be the start
// of a tag is held back until the next piece decides it. Tool-call markup is held to the end and parsed
// then; markup that does not parse is returned as content, never dropped.
#pragma once
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

class OutputParser {
 public:
  // reasoning: split <think>...</think>; starts_in_reasoning: the prompt already opened <think>
  // (templates that force thinking), so the text begins as reasoning. tools: parse tool calls.
  OutputParser(bool reasoning, bool starts_in_reasoning, bool tools);
  TextDelta push(std::string_view text);
  // The rest, at the end of generation; tool calls become available.
  TextDelta finish();
  const std::vector<ToolCall>& tool_calls() const { return calls_; }

 private:
  enum class Mode { Content, Reasoning, Tools };
  void emit(TextDelta& d, std::string_view text);
  bool reasoning_, tools_;
  Mode mode_;
  bool think_seen_ = false;   // one reasoning block per reply
  bool trim_leading_ = false;  // drop the blank lines a model writes after </think>
  std::string pending_;       // text that may be the start of a tag
  std::string tool_text_;     // from the first <tool_call> on
  std::vector<ToolCall> calls_;
};

}  // namespace ingot::server
