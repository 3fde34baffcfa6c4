// Activation-aware INT4 (after Lin et al. 2023, "AWQ: Activation-aware Weight Quantization"; our own
// implementation of the published idea): before round-to-nearest, each quantized linear's input
// channels get a per-channel scale s searched on calibration activations, the weight's columns are
// multiplied by s and the op that produces the linear's input divides by s, so the unquantized model
// computes the same function while the channels that carry large activations lose less to rounding.
//
// Where s^-1 is folded (every fold exact; the scales are powers of two, so multiplying or dividing a
// bf16/fp16/f32 weight by them rounds nothing):
//   wqkv      [qkv, hidden]  input = rmsnorm(x) * attn_norm  -> attn_norm /= s
//   w_gate_up [2I, hidden]   input = rmsnorm(x) * mlp_norm   -> mlp_norm /= s
//   wo        [hidden, q]    input = attention output, a mix of v rows -> wqkv's v rows (and v bias) /= s;
//                            with GQA several q heads read one kv head, so s is tied across them
//   w_down    [hidden, I]    input = silu(gate) * up          -> w_gate_up's up rows /= s
// Supported: attention-only families without gated attention (llama, qwen2, qwen3); others refused.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/engine.h"

namespace ingot {

inline constexpr int kAwqGrid = 20;                  // alphas 0, 1/20, ..., 19/20 (0 is plain RTN)
inline constexpr int64_t kAwqKeptRows = 256;         // activation rows per weight kept for the error search
inline constexpr int64_t kAwqMinTokens = 16;         // fewer calibration tokens say nothing about channels
inline constexpr int64_t kAwqMaxTokens = 1 << 18;    // a bound on the CPU forward's time
inline constexpr int64_t kAwqChunk = 512;            // tokens per calibration forward (one cache row)
inline constexpr int kAwqClipGrid = 10;              // clip ratios 1, 0.95, ..., 0.55 (1 is plain RTN)

// What the search chose for one weight: alpha, and the output error sum_x ||(Q(W s) s^-1 - W) x||^2 on
// the kept calibration rows for alpha 0 (plain RTN) and for the chosen alpha.
struct AwqChoice {
  std::string name;
  float alpha = 0.0f;
  double err_rtn = 0.0, err_awq = 0.0;
  std::vector<float> s;                // [in] the chosen input scales (ones for alpha 0)
  std::vector<float> clip;             // [out, in/group] the chosen clip ratios (search_awq_clip)
  double err_clip = 0.0;               // the output error with those clip ratios (<= err_awq)
};

// Per-input-channel activation statistics of one linear weight over the calibration tokens.
struct AwqActivations {
  std::vector<double> mean_abs;  // [in] mean |x| over every calibration token
  std::vector<float> rows;       // [kept, in] an evenly spaced subset of the input rows (f32)
  int64_t kept = 0, in = 0;
};

// Runs the (unquantized) engine on the CPU over `ids` in chunks of kAwqChunk tokens and returns the
// input activations of every INT4-quantizable weight, by runtime name.
std::map<std::string, AwqActivations> collect_awq_activations(const Engine& eng, const std::vector<int32_t>& ids);

// The search for one weight w [out, in] (f32 values of the engine dtype): for each alpha of the grid,
// s = mean_abs^alpha normalised by sqrt(max * min) and rounded to a power of two, RTN of W diag(s) with
// scales in scale_dtype, error on the kept rows; returns the best s (all ones when alpha 0 wins).
std::vector<float> search_awq_scales(const float* w, int64_t out, int64_t in, const AwqActivations& act,
                                     std::vector<double> mean_abs, int64_t group, DType scale_dtype, AwqChoice& choice);

// AWQ's second search, per (row, group) of a weight already scaled, w' = W diag(s) [out, in] (f32 values
// of the engine dtype), whose input is x / s: the clip ratio r of the grid whose round to nearest with
// group scale r * max|w'| / 7 (quantize_int4's clip) leaves the least output error of that group,
// sum over the kept rows of (sum_i (Q(w')_i - w'_i) x_i / s_i)^2; r = 1 is plain RTN, so no group's error
// grows. A smaller scale costs no fold, so it stays exact in any weight dtype. Sets choice.clip and
// choice.err_clip (the weight's whole output error with the chosen ratios).
void search_awq_clip(const float* w, int64_t out, int64_t in, const AwqActivations& act, int64_t group,
                     DType scale_dtype, AwqChoice& choice);

// Searches every layer's four scales on `ids` and folds them into the engine (still unquantized; the
// function the engine computes is unchanged bit for bit up to the folding's exactness, see above).
// Error naming `flag` for an unsupported family or an already quantized engine.
std::vector<AwqChoice> apply_awq_scales(Engine& eng, const std::vector<int32_t>& ids, int64_t group,
                                        const std::string& flag = "--calibration");

// apply_awq_scales, search_awq_clip on every folded weight, then quantize_engine_int4 with those clip
// ratios; the engine's provenance records the calibration.
// lm_head: the untied LM head too, by plain RTN (its input, the final norm's output, gets no scales).
std::vector<AwqChoice> quantize_engine_awq(Engine& eng, const std::vector<int32_t>& ids, int64_t group,
                                           const std::string& flag = "--calibration", bool lm_head = false);

// Calibration tokens from the command line's files: exactly one of `text_file` (tokenized by the
// tokenizer of `model_dir`, no special tokens) and `ids_file` (whitespace-separated token ids), each
// id below `vocab`, between kAwqMinTokens and kAwqMaxTokens of them. Errors name the flag and file.
std::vector<int32_t> read_calibration(const std::string& text_file, const std::string& ids_file,
                                      const std::string& model_dir, int64_t vocab);

}  // namespace ingot
