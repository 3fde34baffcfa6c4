#include "runtime/chat.h"

#include "core/error.h"
#include "core/files.h"
#include "template/chat_template.h"

namespace ingot {

namespace {

// Parses `text`, naming `source` (when set) before the template's own "chat template line N: ...".
std::shared_ptr<const tmpl::ChatTemplate> parse(std::string text, const std::string& source) {
  try {
    return std::make_shared<const tmpl::ChatTemplate>(std::move(text));
  } catch (const Error& e) {
    if (source.empty()) throw;
    throw Error(source + ": " + e.what());
  }
}

}  // namespace

ChatFormat::ChatFormat(std::shared_ptr<const tmpl::ChatTemplate> t, std::string source)
    : t_(std::move(t)), source_(std::move(source)) {}

ChatFormat ChatFormat::from_tokenizer(const tok::Tokenizer& tokenizer, const std::string& source) {
  if (tokenizer.chat_template().empty())
    throw Error((source.empty() ? std::string("the tokenizer") : source) +
                " has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja): "
                "give one with --chat-template FILE");
  return ChatFormat(parse(tokenizer.chat_template(), source), source);
}

ChatFormat ChatFormat::from_file(const std::string& path) {
  std::string text = read_file(path);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw Error(path + ": the chat template file is empty");
  return ChatFormat(parse(std::move(text), path), path);
}

std::string ChatFormat::render(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                               const ChatOptions& o) const {
  if (!messages.is_array()) throw Error("chat messages must be a JSON list of {role, content} objects");
  if (messages.empty()) throw Error("chat messages are empty: a conversation needs at least one message");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  // Only the special tokens the tokenizer sets, as transformers passes them.
  if (tokenizer.bos_id()) ctx["bos_token"] = tokenizer.id_to_piece(*tokenizer.bos_id());
  if (!tokenizer.eos_ids().empty()) ctx["eos_token"] = tokenizer.id_to_piece(tokenizer.eos_ids().front());
  ctx["messages"] = messages;
  ctx["tools"] = o.tools.is_null() ? nlohmann::ordered_json() : o.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = o.add_generation_prompt;
  if (o.enable_thinking) ctx["enable_thinking"] = *o.enable_thinking;
  try {
    return t_->render(ctx);
  } catch (const Error& e) {
    if (source_.empty()) throw;
    throw Error(source_ + ": " + e.what());
  }
}

std::optional<ChatFormat::NextTurn> ChatFormat::next_turn(const tok::Tokenizer& tokenizer,
                                                          const nlohmann::ordered_json& messages, const ChatOptions& o,
                                                          const std::vector<std::string>& turn_ends,
                                                          const std::string& rendered) const {
  if (!messages.is_array() || messages.size() < 2 || !messages.back().is_object()) return std::nullopt;
  // Control characters no tokenizer vocabulary or template filter is likely to touch.
  static constexpr std::string_view kSentinel = "\x01ingot:next-turn\x02";
  nlohmann::ordered_json probe = messages;
  probe.back()["content"] = std::string(kSentinel);
  const std::string marked = render(tokenizer, probe, o);
  const size_t at = marked.find(kSentinel);
  if (at == std::string::npos) return std::nullopt;
  size_t start = std::string::npos;
  std::string marker;
  for (const std::string& end : turn_ends) {
    if (end.empty() || at < end.size()) continue;
    const size_t p = marked.rfind(end, at - end.size());
    if (p != std::string::npos && (start == std::string::npos || p + end.size() > start)) {
      start = p + end.size();
      marker = end;
    }
  }
  if (start == std::string::npos) return std::nullopt;
  // The two renderings differ only from the last message's content on.
  if (rendered.size() < start || rendered.compare(0, start, marked, 0, start) != 0) return std::nullopt;
  return NextTurn{marker, rendered.substr(start)};
}

std::string render_chat(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages, const ChatOptions& o) {
  return ChatFormat::from_tokenizer(tokenizer, "").render(tokenizer, messages, o);
}

}  // namespace ingot
