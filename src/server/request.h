// The OpenAI request bodies of /v1/chat/completions and /v1/completions, parsed and validated into
// one ApiRequest before anything is tokenized or queued. Every field is checked for its type and
// range; a bad one throws ApiError (400) naming it and the limit, and a parameter ingot does not
// implement (logit_bias, echo, forced tool choice, ...) is refused the same way instead of being
// ignored. Sampling (temperature, top_p, top_k, min_p, repetition_penalty, frequency_penalty,
// presence_penalty, seed) and log-probabilities (chat logprobs + top_logprobs 0..20, completions
// logprobs 0..5) are implemented. Unknown fields are refused too (as OpenAI does), so a misspelt parameter
// does not silently fall back to its default. Pure: no model, no tokenizer (fuzzed by
// tests/fuzz/fuzz_server_request.cpp).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"

namespace ingot::server {

enum class Endpoint { Chat, Completion };

struct RequestLimits {
  int max_n = 16;             // choices per request
  size_t max_stop = 16;       // stop strings
  size_t max_stop_bytes = 256;  // each
  int max_depth = 64;         // JSON nesting
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;  // "" when not given

  // chat
  nlohmann::ordered_json messages;          // validated: a non-empty list of {role, content, ...}
  nlohmann::ordered_json tools;             // null or a non-empty list of tool definitions
  std::optional<bool> enable_thinking;      // chat_template_kwargs.enable_thinking

  // completions
  std::string prompt_text;
  std::vector<int64_t> prompt_ids;  // set when the prompt is a list of token ids (range-checked later)
  bool prompt_is_ids = false;

  std::optional<int64_t> max_tokens;  // max_completion_tokens or max_tokens
  std::vector<std::string> stop;
  SamplingParams sampling;  // temperature 1 unless given (OpenAI's default)
  bool seed_given = false;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (vLLM, llama.cpp): do not stop at the eos ids
  // Log-probabilities of each generated token plus this many alternatives, or -1: none asked. Chat:
  // top_logprobs (0..20) when logprobs is true; completions: logprobs (0..5).
  int logprobs = -1;
};

// Throws ApiError: 400 for malformed JSON, a body that is not an object, or a bad field.
ApiRequest parse_request(Endpoint e, std::string_view body, const RequestLimits& limits = {});

}  // namespace ingot::server
