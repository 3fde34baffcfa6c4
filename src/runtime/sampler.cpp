#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

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
  work_.assign(logits, logits + V);
  if (p_.repetition_penalty != 1.0f) {
    // Each distinct earlier token once: positive scores shrink, negative ones grow.
    std::vector<int32_t> seen(history);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= V) continue;
      float& s = work_[size_t(t)];
      s = s > 0 ? s / p_.repetition_penalty : s * p_.repetition_penalty;
    }
  }
  if (p_.temperature <= 0.0f) return int32_t(std::max_element(work_.begin(), work_.end()) - work_.begin());

  for (float& s : work_) s /= p_.temperature;
  idx_.resize(size_t(V));
  std::iota(idx_.begin(), idx_.end(), 0);
  // Candidates in descending score, ties by lower id, so filtering is deterministic.
  auto by_score = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  size_t keep = size_t(V);
  if (p_.top_k > 0 && size_t(p_.top_k) < keep) {
    keep = size_t(p_.top_k);
    std::partial_sort(idx_.begin(), idx_.begin() + long(keep), idx_.end(), by_score);
  } else {
    std::sort(idx_.begin(), idx_.end(), by_score);
  }
  const float mx = work_[size_t(idx_[0])];
  std::vector<double> prob(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp(double(work_[size_t(idx_[i])] - mx)));
  for (double& p : prob) p /= sum;
  if (p_.min_p > 0.0f) {  // drop tokens below min_p times the top probability
    const double floor = double(p_.min_p) * prob[0];
    size_t k = 1;
    while (k < keep && prob[k] >= floor) ++k;
    keep = k;
  }
  if (p_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    size_t k = 0;
    while (k < keep) {
      acc += prob[k++];
      if (acc >= double(p_.top_p)) break;
    }
    keep = std::max<size_t>(k, 1);
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += prob[i];
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    if ((u -= prob[i]) <= 0) return idx_[i];
  }
  return idx_[keep - 1];
}

}  // namespace ingot
