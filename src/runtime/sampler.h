// Token choice from a row of logits already on the host (the first token after a prefill): greedy, or
// seeded sampling with repetition penalty, temperature, top-k, min-p and top-p, applied in that order
// (transformers' logits processors' order). It runs the backends' sample op definition
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
  bool greedy() const { return temperature <= 0.0f && repetition_penalty == 1.0f; }
  bool operator==(const SamplingParams&) const = default;
  void validate() const;  // throws Error naming the bad setting
  SampleParams to_backend() const {
    return SampleParams{temperature, int32_t(top_k), top_p, min_p, repetition_penalty, seed};
  }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p) { p.validate(); }
  // history: the tokens the repetition penalty applies to (prompt and generated so far); each distinct
  // token counts once. Each call takes the next draw of the seed's stream. Returns -1
  // (sampling::kNoToken) for logits without a pick (a NaN or +inf, or none finite), as the sample op.
  int32_t pick(const float* logits, int64_t vocab, const std::vector<int32_t>& history);
  uint32_t draws() const { return draws_; }

 private:
  SamplingParams p_;
  uint32_t draws_ = 0;
  std::vector<uint8_t> seen_;
};

}  // namespace ingot
