// Chat prompts: the model's chat template rendered over messages the way transformers'
// apply_chat_template does (tools/documents defined as null when absent, enable_thinking only when set,
// bos/eos token strings from the tokenizer), then tokenized without adding special tokens.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ingot {

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;
  nlohmann::ordered_json tools;  // null or a list of tool definitions
};

// Throws Error when the tokenizer has no chat template or the template fails (the message names the line).
std::string render_chat(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages, const ChatOptions& o);

inline std::vector<int32_t> chat_ids(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                     const ChatOptions& o) {
  return tokenizer.encode(render_chat(tokenizer, messages, o), false);
}

}  // namespace ingot
