// Weight-only INT4: the one packed layout every INT4 weight has at run time, whatever made it
// (round-to-nearest at build, or a published GPTQ / AWQ / compressed-tensors checkpoint converted into
// it by io/quantized_checkpoint.h). A weight [out, in] of the runtime table becomes:
//   <name>         [out, in/2] uint8: stored column k of a row in byte k/2, low nibble first (even k low)
//   <name>.scales  [out, in/group] in the engine's weight dtype (f32, f16 or bf16)
//   <name>.zeros   [out, in/group] uint8 in 0..15, only when not symmetric (absent: every zero is 8)
//   <name>.perm    [in] int32, only with act-order: stored column j multiplies input feature perm[j]
// and value = (nibble - zero) * scale of its group. Round-to-nearest is symmetric (zero 8) and leaves
// nibble 0 (-8) unused (its range is [-7, 7] so that the largest magnitude of a group is exact).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/int4_row.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "models/spec.h"
#include "models/weights.h"

namespace ingot {

inline constexpr const char* kInt4ScalesSuffix = ".scales";
inline constexpr const char* kInt4ZerosSuffix = ".zeros";
inline constexpr const char* kInt4PermSuffix = ".perm";
inline constexpr int64_t kInt4MinGroup = 32, kInt4MaxGroup = 256;
// The groups every backend's kernels take (and --group-size's rule): a power of two in
// [kInt4MinGroup, kInt4MaxGroup]. The published formats allow more (int4_group_problem).
inline constexpr bool int4_kernel_group(int64_t g) {
  return g >= kInt4MinGroup && g <= kInt4MaxGroup && (g & (g - 1)) == 0;
}

// How an engine's weights are quantized (absent: none). Engine files record it as
// weights.quantization (docs/quantization.md).
struct QuantConfig {
  // How the values were chosen: "rtn" (round to nearest at build), or the published format they were
  // converted from: "gptq", "awq", "compressed-tensors".
  std::string method = "rtn";
  std::string format;          // the published checkpoint format: "gptq", "gptq_v2", "gemm", "pack-quantized"; "" for rtn
  int bits = 4;
  int64_t group_size = 128;    // columns (input features) sharing one scale; -1: one group per row
  // A published checkpoint's own group size where the runtime groups differ (int4_runtime_group: a
  // whole row, -1, held as groups of a power of two); 0: the same as group_size.
  int64_t published_group = 0;
  bool symmetric = true;       // false: every INT4 weight has <name>.zeros
  bool act_order = false;      // true: every INT4 weight has <name>.perm
  std::vector<std::string> tensors;  // runtime names of the INT4 weights, in table order
  // The group of a weight with `cols` input columns: group_size, or cols when it is -1.
  int64_t group(int64_t cols) const { return group_size < 0 ? cols : group_size; }
};

// The runtime weights a quantized build stores as INT4: the decoder layers' linear projections (fused
// q/k/v, o, fused gate/up, down). Embeddings, norms, the LM head and the linear-attention weights stay
// in the engine dtype.
bool int4_quantizable(const WeightSpec& w);
// The table's quantizable weights, checked against the group size first: Error naming `flag` and the
// first tensor whose input dimension it does not divide, or the group size when it is not a power of
// two in [32, 256].
// lm_head: the LM head ("lm_head", untied models only) too (--quantize-lm-head); Error for a tied model,
// whose head is the embedding table (quantizing it would change the embedding lookup as well).
QuantConfig plan_int4(const WeightTable& table, int64_t group_size, const std::string& flag, bool lm_head = false);
// A weight an engine may hold as INT4: int4_quantizable, or the untied LM head.
bool int4_allowed(const WeightSpec& w);

// [out, in/2] and [out, in/group] for a weight of runtime shape [out, in].
Shape int4_packed_shape(const Shape& shape);
Shape int4_scales_shape(const Shape& shape, int64_t group_size);
// The method names an engine file may record (rtn, and the published formats).
bool int4_method_known(const std::string& method);
// The group-size rule of the published formats (and every reader of the runtime layout): -1 (whole
// row), or an even size >= 2 that divides `cols`. Error text for a size that breaks it, or "".
std::string int4_group_problem(int64_t group_size, int64_t cols);
// The group size the runtime layout gives a published checkpoint whose weights have these input
// dimensions: its own when it is a power of two in [kInt4MinGroup, kInt4MaxGroup]; otherwise (a whole
// row, -1, or another even size) the largest such power of two that divides every weight's group,
// so that every backend's kernels take it. The values do not change: each published group's scale
// (and zero) repeats over the runtime groups it spans. Past that (no power of two from 32 divides
// the groups), the group as published.
int64_t int4_runtime_group(int64_t group_size, const std::vector<int64_t>& cols);
// The input dimensions int4_runtime_group reads for a model: those of every weight a checkpoint may
// hold as INT4 (int4_quantizable), so the loader's device check and the build agree.
std::vector<int64_t> int4_quantizable_cols(const WeightTable& table);
// Value checks of a weight's optional tensors, which the readers index by: every zero in 0..15, the
// perm a permutation of 0..in-1. Error naming `name` on the first bad value.
void check_int4_zeros(const std::string& name, const uint8_t* zeros, int64_t n);
void check_int4_perm(const std::string& name, const int32_t* perm, int64_t in);

// Round to nearest, per group: scale = clip * max|w| / 7 rounded to scale_dtype, nibble = clamp(round(w /
// scale), -7, 7) + 8 (a group of zeros gets scale 0). w [rows, cols] f32; packed [rows, cols/2];
// scales [rows, cols/group] in scale_dtype; clip [rows, cols/group] in (0, 1], or null: every clip 1
// (plain RTN; the activation-aware build searches smaller ones, runtime/awq.h).
void quantize_int4(const float* w, int64_t rows, int64_t cols, int64_t group_size, DType scale_dtype, uint8_t* packed,
                   void* scales, const float* clip = nullptr);
// weights.quantization of an engine file: "none", or the object docs/quantization.md describes.
nlohmann::json quant_json(const QuantConfig* q, DType scale_dtype);

}  // namespace ingot
