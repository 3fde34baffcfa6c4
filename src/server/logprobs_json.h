// Generated tokens' log-probabilities (runtime TokenLogprob, the raw logits' log_softmax) in OpenAI's
// two response shapes. A token's text is its own decode (special tokens included, so an eos token
// shows); a token holding only part of a UTF-8 character decodes to U+FFFD, as the tokenizer's
// decode does, and `bytes` are that text's bytes. Values JSON cannot hold (-inf) become null.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace ingot::server {

// Chat: the entries of choices[i].logprobs.content,
// [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], one per token.
nlohmann::json chat_logprobs(const tok::Tokenizer& tk, std::span<const int32_t> ids,
                             std::span<const TokenLogprob> lps);

// Completions (the legacy shape): {tokens, token_logprobs, top_logprobs, text_offset}, where
// top_logprobs[i] maps the text of each alternative (and of the token picked, as OpenAI's legacy API
// always includes it) to its log-probability, and text_offset[i] is where token i's text starts in
// the choice's text, counting from `offset` (advanced past these tokens, for the next stream chunk).
nlohmann::json completion_logprobs(const tok::Tokenizer& tk, std::span<const int32_t> ids,
                                   std::span<const TokenLogprob> lps, int64_t& offset);

}  // namespace ingot::server
