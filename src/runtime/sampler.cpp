// The host Sampler: the validation of user settings and the reference sampler over a history.
#include "runtime/sampler.h"

#include <cmath>

#include "backend/sampling.h"
#include "core/error.h"

namespace ingot {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) throw Error("--temperature must be >= 0");
  if (top_k < 0) throw Error("--top-k must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) throw Error("--top-p must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p < 1.0f)) throw Error("--min-p must be in [0, 1)");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) throw Error("--repetition-penalty must be > 0");
  // OpenAI's range: beyond it a penalty only drives a token's probability to 0 or 1.
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) throw Error("--frequency-penalty must be in [-2, 2]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) throw Error("--presence-penalty must be in [-2, 2]");
}

int32_t Sampler::pick(const float* logits, int64_t V, const std::vector<int32_t>& history,
                      const std::vector<int32_t>& generated) {
  const uint8_t* seen = nullptr;
  if (p_.repetition_penalty != 1.0f) {
    seen_.assign(size_t(V), 0);
    for (int32_t t : history)
      if (t >= 0 && t < V) seen_[size_t(t)] = 1;
    seen = seen_.data();
  }
  const int32_t* counts = nullptr;
  if (p_.counts_tokens()) {
    counts_.assign(size_t(V), 0);
    for (int32_t t : generated)
      if (t >= 0 && t < V) ++counts_[size_t(t)];
    counts = counts_.data();
  }
  return sampling::sample_row(logits, V, p_.to_backend(), seen, counts, draws_++);
}

}  // namespace ingot
