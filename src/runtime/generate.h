// Generation of token ids over one cache row: prefill (in chunks that fit the workspace), then one token
// per decode step through the same forward, greedy or sampled. Text lives a layer above.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/error.h"
#include "runtime/model.h"

namespace ingot {

struct GenerateOptions {
  int max_new_tokens = 16;
  std::vector<int64_t> eos_ids;  // stop after emitting one of these; empty = run to max_new_tokens
  int row = 0;                   // cache row to use
  int64_t prefill_chunk = 0;     // tokens per prefill call; 0 = as many as the workspace holds
  SamplingParams sampling;       // greedy unless set
};

// Called once per generated token: step (0 = the token from prefill), whether it came from prefill.
using TokenCallback = std::function<void(int step, bool from_prefill, int32_t token)>;

// Throws Error (before any compute) when the request is empty, or when a prompt of prompt_len plus
// max_new_tokens does not fit the model's capacity (State's rule).
void check_fits(const Model& model, int64_t prompt_len, int max_new_tokens);

// Runs `tokens` through one cache row from slot `start` on, in calls of at most `chunk` tokens (0 = as
// many as the workspace holds). Returns the logits of the last token, [1, vocab].
HostTensor prefill_row(Model& model, int row, std::span<const int32_t> tokens, int64_t start, int64_t chunk = 0);

// The Error that stops generation when the logits of `step` (0 = the token after the prompt) have no
// pick: a NaN or +inf among them, or none finite (sampling::kNoToken from the ops or the Sampler).
Error non_finite_logits(int step);

// Greedy picks are the argmax; a sampled first token is drawn on the host from the prefill's logits and
// the device continues the same seeded stream, with the prompt and that token as the penalty's history
// (as Session does), so a seed picks the same tokens on every backend. Throws Error before any compute
// if the request does not fit the model's capacity, and non_finite_logits(step) when a step's logits
// are not finite.
std::vector<int32_t> generate_ids(Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                  const TokenCallback& on_token = {});

}  // namespace ingot
