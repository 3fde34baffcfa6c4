// Chat prompts: a chat template rendered over messages the way transformers' apply_chat_template does
// (tools/documents defined as null when absent, enable_thinking only when set, bos/eos token strings
// from the tokenizer), then tokenized without adding special tokens. The template is the model's own
// or a file that replaces it (`--chat-template FILE`).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ingot {

namespace tmpl {
class ChatTemplate;
}

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;
  nlohmann::ordered_json tools;  // null or a list of tool definitions
};

// A chat template parsed once, ready to render any number of conversations. Copies share it.
class ChatFormat {
 public:
  // The tokenizer's template; `source` (the model's folder or engine file) names it in messages.
  // Throws Error when there is none, naming the fix (--chat-template FILE), or when it does not parse
  // (naming the line).
  static ChatFormat from_tokenizer(const tok::Tokenizer& tokenizer, const std::string& source);
  // The text of the file at `path`, in place of the model's template. Throws Error naming the file
  // when it is missing, a directory, unreadable, empty or does not parse (with the template's line).
  static ChatFormat from_file(const std::string& path);

  // Throws Error when the messages are not a list or the template fails (the message names the line).
  std::string render(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                     const ChatOptions& o) const;
  std::vector<int32_t> ids(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                           const ChatOptions& o) const {
    return tokenizer.encode(render(tokenizer, messages, o), false);
  }

  // The text a conversation's last message adds, as the template renders it, after the end-of-turn
  // marker that closes the turn before it: for continuing a model whose state cannot be rewound
  // (linear attention). Templates such as Qwen3's and Qwen3.5's render earlier assistant turns
  // otherwise than they were generated (their thinking dropped), so the re-rendered conversation does
  // not extend the tokens the model holds and would be prefilled whole every turn (the cost llama.cpp
  // pays, its issue #20225); appending this text to the held tokens prefills only the new turn.
  // Found by rendering the last message with a sentinel as its content: the suffix starts after the
  // last of `turn_ends` (the end-of-turn token texts) before the sentinel. `marker` is that end-of-turn
  // text (the caller adds it when the held tokens do not end with it: a reply cut by a length limit).
  // `rendered` is render(tokenizer, messages, o), which the caller has already.
  // nullopt when there are fewer than two messages or the rendering shows no such marker.
  struct NextTurn {
    std::string marker, text;
  };
  std::optional<NextTurn> next_turn(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                    const ChatOptions& o, const std::vector<std::string>& turn_ends,
                                    const std::string& rendered) const;

 private:
  ChatFormat(std::shared_ptr<const tmpl::ChatTemplate> t, std::string source);
  std::shared_ptr<const tmpl::ChatTemplate> t_;
  std::string source_;  // where the template came from, for render errors
};

// Renders with the tokenizer's own template (ChatFormat::from_tokenizer's errors).
std::string render_chat(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages, const ChatOptions& o);

inline std::vector<int32_t> chat_ids(const tok::Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                     const ChatOptions& o) {
  return tokenizer.encode(render_chat(tokenizer, messages, o), false);
}

}  // namespace ingot
