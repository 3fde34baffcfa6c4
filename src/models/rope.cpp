#include "models/rope.h"

#include <algorithm>
#include <cmath>

namespace ingot {

std::vector<float> rope_inv_freq(const ModelSpec& s) {
  const RopeSpec& r = s.rope;
  const int64_t dim = s.rope_dim();
  std::vector<float> inv(size_t(dim / 2));
  // Base frequencies exactly as transformers forms them: f32 exponent, f32 power, f32 reciprocal.
  std::vector<float> pos_freq(inv.size());
  for (int64_t i = 0; i < dim / 2; ++i) {
    float e = float(2 * i) / float(dim);
    pos_freq[i] = float(std::pow(r.theta, double(e)));
    inv[i] = 1.0f / pos_freq[i];
  }
  if (r.type == "linear") {
    for (float& v : inv) v /= float(r.factor);
  } else if (r.type == "llama3") {
    const double old_ctx = double(r.original_max_position);
    const double low_wl = old_ctx / r.low_freq_factor, high_wl = old_ctx / r.high_freq_factor;
    for (float& v : inv) {
      float wl = float(2.0 * M_PI) / v;
      float scaled = wl > low_wl ? v / float(r.factor) : v;
      if (!(wl < high_wl) && !(wl > low_wl)) {
        float smooth = (float(old_ctx) / wl - float(r.low_freq_factor)) / float(r.high_freq_factor - r.low_freq_factor);
        scaled = (1.0f - smooth) * scaled / float(r.factor) + smooth * scaled;
      }
      v = scaled;
    }
  } else if (r.type == "yarn") {
    auto corr_dim = [&](double rot) {
      return (double(dim) * std::log(double(r.original_max_position) / (rot * 2.0 * M_PI))) / (2.0 * std::log(r.theta));
    };
    double low = corr_dim(r.beta_fast), high = corr_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < dim / 2; ++i) {
      float ramp = (float(i) - float(low)) / (float(high) - float(low));
      ramp = std::min(1.0f, std::max(0.0f, ramp));
      float extrap_factor = 1.0f - ramp;
      float extrap = 1.0f / pos_freq[i];
      float interp = 1.0f / (float(r.factor) * pos_freq[i]);
      inv[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
  }
  return inv;
}

float rope_attention_scale(const ModelSpec& s) {
  const RopeSpec& r = s.rope;
  if (r.type != "yarn") return 1.0f;
  if (r.attention_factor) return float(*r.attention_factor);
  auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0)
    return float(mscale(r.factor, *r.mscale) / mscale(r.factor, *r.mscale_all_dim));
  return float(mscale(r.factor, 1.0));
}

}  // namespace ingot
