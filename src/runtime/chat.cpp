#include "runtime/chat.h"

#include "core/error.h"
#include "template/chat_template.h"

namespace ingot {

std::string render_chat(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages, const ChatOptions& o) {
  if (tokenizer.chat_template().empty())
    throw Error("the tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)");
  if (!messages.is_array()) throw Error("chat messages must be a JSON list of {role, content} objects");
  if (messages.empty()) throw Error("chat messages are empty: a conversation needs at least one message");
  tmpl::ChatTemplate t(tokenizer.chat_template());
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  // Only the special tokens the tokenizer sets, as transformers passes them.
  if (tokenizer.bos_id()) ctx["bos_token"] = tokenizer.id_to_piece(*tokenizer.bos_id());
  if (!tokenizer.eos_ids().empty()) ctx["eos_token"] = tokenizer.id_to_piece(tokenizer.eos_ids().front());
  ctx["messages"] = messages;
  ctx["tools"] = o.tools.is_null() ? nlohmann::ordered_json() : o.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = o.add_generation_prompt;
  if (o.enable_thinking) ctx["enable_thinking"] = *o.enable_thinking;
  return t.render(ctx);
}

}  // namespace ingot
