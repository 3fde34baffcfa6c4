// Token choice from a row of logits already on the host (the first token after a prefill): greedy, or
// seeded sampling with repetition penalty, frequency and presence penalties, temperature, top-k, min-p
// and top-p, applied in that order (transformers' logits processors' order, with OpenAI's additive
// penalties where vLLM applies them). It runs the backends' sample op definition
// (backend/sampling.h) with the same counter-based random stream, so a Sampler after n draws and a
// device sampling state after n draws pick the same token from the same logits; Model::decode
// continues the stream on the device from draws().
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace ingot {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  uint64_t seed = 0;
  // OpenAI's penalties over the tokens generated so far (not the prompt), each in [-2, 2], 0 = off;
  // last so that positional initialisers written before them keep their meaning.
  float frequency_penalty = 0.0f;  // subtracted once per earlier occurrence
  float presence_penalty = 0.0f;   // subtracted once when the token occurred at all
  bool counts_tokens() const { return frequency_penalty != 0.0f || presence_penalty != 0.0f; }
  bool greedy() const { return temperature <= 0.0f && repetition_penalty == 1.0f && !counts_tokens(); }
  bool operator==(const SamplingParams&) const = default;
  void validate() const;  // throws Error naming the bad setting
  SampleParams to_backend() const {
    return SampleParams{temperature, int32_t(top_k), top_p, min_p, repetition_penalty, seed, frequency_penalty,
                        presence_penalty};
  }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p) { p.validate(); }
  // history: the tokens the repetition penalty applies to (prompt and generated so far); each distinct
  // token counts once. generated: the tokens the frequency and presence penalties count (only what
  // was generated, each occurrence). Each call takes the next draw of the seed's stream. Returns -1
  // (sampling::kNoToken) for logits without a pick (a NaN or +inf, or none finite), as the sample op.
  int32_t pick(const float* logits, int64_t vocab, const std::vector<int32_t>& history,
               const std::vector<int32_t>& generated = {});
  uint32_t draws() const { return draws_; }

 private:
  SamplingParams p_;
  uint32_t draws_ = 0;
  std::vector<uint8_t> seen_;
  std::vector<int32_t> counts_;
};

}  // namespace ingot
