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
}

int32_t Sampler::pick(const float* logits, int64_t V, const std::vector<int32_t>& history) {
  const uint8_t* seen = nullptr;
  if (p_.repetition_penalty != 1.0f) {
    seen_.assign(size_t(V), 0);
    for (int32_t t : history)
      if (t >= 0 && t < V) seen_[size_t(t)] = 1;
    seen = seen_.data();
  }
  return sampling::sample_row(logits, V, p_.to_backend(), seen, draws_++);
}

}  // namespace ingot
