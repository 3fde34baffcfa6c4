// INT4: which weights, the group-size rule, round-to-nearest packing, and the engine-file description
// (the dequantization every reader shares is backend/int4_row.h).
#include "quant/int4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

namespace ingot {

bool int4_quantizable(const WeightSpec& w) {
  return w.layer >= 0 && (w.layer_field == &LayerWeights::wqkv || w.layer_field == &LayerWeights::wo ||
                          w.layer_field == &LayerWeights::w_gate_up || w.layer_field == &LayerWeights::w_down);
}

bool int4_allowed(const WeightSpec& w) { return int4_quantizable(w) || (w.layer < 0 && w.name == "lm_head"); }

QuantConfig plan_int4(const WeightTable& table, int64_t g, const std::string& flag, bool lm_head) {
  if (!int4_kernel_group(g))
    throw Error(flag + " " + std::to_string(g) + " is not a power of two in [" + std::to_string(kInt4MinGroup) + ", " +
                std::to_string(kInt4MaxGroup) + "]");
  QuantConfig q;
  q.group_size = g;
  bool head_found = false;
  for (const WeightSpec& w : table.entries()) {
    const bool head = lm_head && w.layer < 0 && w.name == "lm_head";
    head_found |= head;
    if (!int4_quantizable(w) && !head) continue;
    if (w.shape.size() != 2 || w.shape[1] % g != 0)
      throw Error(flag + " " + std::to_string(g) + " does not divide the input dimension " +
                  std::to_string(w.shape.back()) + " of weight '" + w.name + "' " + shape_str(w.shape) +
                  "; choose a group size that divides it");
    q.tensors.push_back(w.name);
  }
  if (lm_head && !head_found)
    throw Error("--quantize-lm-head: the model ties its LM head to the embedding (tie_word_embeddings), and the "
                "embedding lookup stays 16-bit; quantizing the shared table would change it too, so tied heads are not "
                "quantized (build without --quantize-lm-head)");
  if (q.tensors.empty()) throw Error(flag + ": the model has no linear weight to quantize");
  return q;
}

Shape int4_packed_shape(const Shape& s) { return {s.at(0), s.at(1) / 2}; }
Shape int4_scales_shape(const Shape& s, int64_t g) { return {s.at(0), s.at(1) / g}; }

void quantize_int4(const float* w, int64_t rows, int64_t cols, int64_t g, DType sdt, uint8_t* packed, void* scales,
                   const float* clip) {
  const int64_t groups = cols / g;
  // Rows are independent: quantized on all cores (an 8B model's ~7G weights took ~30 s on one).
  parallel_ranges(rows, std::max<int64_t>(1, (int64_t(1) << 20) / cols), [&](int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t k = 0; k < groups; ++k) {
      const float* v = w + r * cols + k * g;
      float amax = 0.0f;
      for (int64_t i = 0; i < g; ++i) amax = std::max(amax, std::fabs(v[i]));
      // The stored scale is what dequantization multiplies by, so round it first and divide by it.
      float s = (clip ? clip[r * groups + k] * amax : amax) / 7.0f;
      convert_from_f32(sdt, &s, static_cast<uint8_t*>(scales) + size_t(r * groups + k) * dtype_size(sdt), 1);
      convert_to_f32(sdt, static_cast<const uint8_t*>(scales) + size_t(r * groups + k) * dtype_size(sdt), &s, 1);
      uint8_t* out = packed + (r * cols + k * g) / 2;
      for (int64_t i = 0; i < g; i += 2) {
        auto nib = [&](float x) {
          const float n = s > 0.0f ? std::nearbyint(x / s) : 0.0f;
          return uint8_t(int(std::clamp(n, -7.0f, 7.0f)) + 8);
        };
        out[i / 2] = uint8_t(nib(v[i]) | (nib(v[i + 1]) << 4));
      }
    }
  }
  });
}

bool int4_method_known(const std::string& m) {
  return m == "rtn" || m == "gptq" || m == "awq" || m == "compressed-tensors";
}

std::string int4_group_problem(int64_t g, int64_t cols) {
  if (g == -1) return "";
  if (g < 2 || g % 2 != 0) return "group size " + std::to_string(g) + " is not -1 (whole row) or an even size >= 2";
  if (cols % g != 0)
    return "group size " + std::to_string(g) + " does not divide the input dimension " + std::to_string(cols);
  return "";
}

int64_t int4_runtime_group(int64_t g, const std::vector<int64_t>& cols) {
  if (int4_kernel_group(g)) return g;
  for (int64_t r = kInt4MaxGroup; r >= kInt4MinGroup; r /= 2)
    if (!cols.empty() && std::all_of(cols.begin(), cols.end(), [&](int64_t c) { return (g < 0 ? c : g) % r == 0 && c % r == 0; }))
      return r;
  return g;
}

std::vector<int64_t> int4_quantizable_cols(const WeightTable& table) {
  std::vector<int64_t> cols;
  for (const WeightSpec& w : table.entries())
    if (int4_quantizable(w)) cols.push_back(w.shape.at(1));
  return cols;
}

void check_int4_zeros(const std::string& name, const uint8_t* z, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (z[i] > 15)
      throw Error("INT4 weight '" + name + "': zero point " + std::to_string(z[i]) + " at index " + std::to_string(i) +
                  " is outside 0..15");
}

void check_int4_perm(const std::string& name, const int32_t* perm, int64_t in) {
  std::vector<bool> seen(size_t(in), false);
  for (int64_t j = 0; j < in; ++j) {
    const int32_t p = perm[j];
    if (p < 0 || p >= in || seen[size_t(p)])
      throw Error("INT4 weight '" + name + "': perm[" + std::to_string(j) + "] = " + std::to_string(p) +
                  " makes it no permutation of 0.." + std::to_string(in - 1));
    seen[size_t(p)] = true;
  }
}

nlohmann::json quant_json(const QuantConfig* q, DType sdt) {
  if (!q) return "none";
  nlohmann::json j = {{"method", q->method},         {"bits", q->bits},
                      {"group_size", q->group_size}, {"symmetric", q->symmetric},
                      {"act_order", q->act_order},   {"layout", "int4_rows_low_nibble_first"},
                      {"scale_dtype", std::string(dtype_name(sdt))}, {"tensors", q->tensors}};
  if (!q->format.empty()) j["format"] = q->format;
  if (q->published_group != 0 && q->published_group != q->group_size) j["published_group_size"] = q->published_group;
  return j;
}

}  // namespace ingot
