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

// Every <tool_call>...</tool_call> block of text, or nothing when any block or the text between them
// is not a tool call (then the caller keeps the text as content).
bool parse_tool_calls(std::string_view text, std::vector<ToolCall>& out) {
  std::vector<ToolCall> calls;
  size_t at = 0;
  for (;;) {
    while (at < text.size() && is_space(text[at])) ++at;
    if (at == text.size()) break;
    if (text.substr(at, kToolOpen.size()) != kToolOpen) return false;
    const size_t body = at + kToolOpen.size();
    const size_t end = text.find(kToolClose, body);
    if (end == std::string_view::npos) return false;
    const auto j = nlohmann::json::parse(text.substr(body, end - body), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    ToolCall c;
    c.name = j["name"].get<std::string>();
    const nlohmann::json args = j.value("arguments", nlohmann::json::object());
    c.arguments = args.is_string() ? args.get<std::string>() : args.dump();
    calls.push_back(std::move(c));
    at = end + kToolClose.size();
  }
  if (calls.empty()) return false;
  out = std::move(calls);
  return true;
}

}  // namespace

OutputParser::OutputParser(bool reasoning, bool starts_in_reasoning, bool tools)
    : reasoning_(reasoning), tools_(tools), mode_(reasoning && starts_in_reasoning ? Mode::Reasoning : Mode::Content) {
  if (mode_ == Mode::Reasoning) think_seen_ = true;
}

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
    if (!parse_tool_calls(tool_text_, calls_)) {
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
