// Token choice from a row of logits: greedy, or seeded sampling with temperature, top-k, top-p, min-p
// and repetition penalty, applied in that order (penalty, temperature, then the filters), as
// transformers' logits processors do. The same seed and inputs give the same tokens.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace ingot {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0f && repetition_penalty == 1.0f; }
  void validate() const;  // throws Error naming the bad setting
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { p.validate(); }
  // history: the tokens the repetition penalty applies to (prompt and generated so far).
  int32_t pick(const float* logits, int64_t vocab, const std::vector<int32_t>& history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> idx_;
};

}  // namespace ingot
