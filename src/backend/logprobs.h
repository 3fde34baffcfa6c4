// The exact definition of the backends' `logprobs` op, shared by the CPU reference
// (src/backend/cpu/cpu_backend.cpp) and the CUDA kernel (src/backend/cuda/logprobs.cu).
//
// What a request's log-probabilities report is the model's own distribution: log_softmax of the raw
// logits, before the repetition/frequency/presence penalties and the temperature (vLLM's default,
// "raw" logprobs), so a token's log-probability does not depend on the sampling settings that picked
// it. For one row l[0, V):
//   m = the largest finite logit, z = log(sum_i exp(l_i - m)) (-inf entries add nothing);
//   lp(t) = (l_t - m) - z, which keeps its precision where logits are large (l_t - (m + z) would
//   round m + z to the logits' magnitude first);
//   top-N: the N tokens with the largest logits, in descending order, ties to the lower id (the
//   candidate order of backend/sampling.h with the raw logit as the score), N <= kMaxTopLogprobs.
// The ids are exact on every backend (comparisons only); the values differ by the rounding of the sum
// (a GPU adds in another order), a few ulps, which the conformance test allows.
// A row with a NaN or +inf logit has no pick (sampling.h) and its values are meaningless: the op still
// writes something finite or NaN there, and callers drop such a row (the request fails).
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/sampling.h"

namespace ingot::sampling {

// OpenAI's largest top_logprobs (chat), and the size of the top-N workspace per row.
constexpr int kMaxTopLogprobs = 20;

// The order key of a raw logit and its id for the top-N: larger first, lower id on ties.
INGOT_HD uint64_t logit_rank(float logit, uint32_t id) { return composite(order_key(logit), id); }

// One row on the host: the log-probability of `chosen` (NaN when chosen is outside [0, V)) and the
// top_n most likely tokens into top_ids/top_lp.
void logprobs_row(const float* logits, int64_t vocab, int32_t chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                  float* top_lp);

}  // namespace ingot::sampling
