// Parity against a transformers reference file (docs/reference-format.md): the reference's rows are
// replayed through every path of the one forward (full prefill, token-by-token decode, random chunk
// splits, all rows batched at different write indices) and the greedy continuation is regenerated.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/model.h"

namespace ingot {

struct Reference {
  HostTensor input_ids;   // [N, S] i64
  HostTensor logits;      // [N, S, V] f32
  int64_t greedy_prompt_len = 0;  // P
  HostTensor greedy_ids;  // [N, P + G] i64
  HostTensor greedy_margin;  // [N, G] f32, the reference's top-1 minus top-2 logit per greedy step; empty if absent
  int64_t rows() const { return input_ids.shape()[0]; }
  int64_t seq() const { return input_ids.shape()[1]; }
  int64_t vocab() const { return logits.shape()[2]; }
  int64_t greedy_new() const { return greedy_ids.shape()[1] - greedy_prompt_len; }
};

Reference load_reference(const std::string& path);  // throws Error naming the file and tensor

// How close a run must come to the reference. A 16-bit run cannot match an fp32 reference bit for bit:
// its logits carry rounding error, and where the reference's top two logits are closer than that error
// the next token may legitimately differ. So agreement is required only where the reference's top-2
// margin is at least tie_margin; raw agreement is reported beside it.
struct Tolerance {
  double atol = 1e-4, rtol = 1e-4;  // every logit: |delta| <= atol + rtol * |reference|
  double mean_atol = INFINITY;      // mean |delta| over a case's logits
  double tie_margin = 0;            // 0: every next token and every greedy token must agree
};

// The defaults (docs/reference-format.md, "Tolerances"). f32 weights and activations: atol 1e-4 on the
// CPU and 1e-3 on a GPU, rtol 1e-4, exact agreement. A 16-bit dtype in weights or activations: atol and
// mean_atol proportional to that dtype's unit roundoff times the RMS of the reference logits, with
// constants from measured runs (when activations are 16-bit as well, also times sqrt(layers / 2):
// every layer rounds again), rtol 0, and tie_margin = atol.
Tolerance default_tolerance(DType weights, DType activations, bool gpu, int64_t layers, const Reference& ref);
// The tie margin that goes with a per-logit bound: atol + rtol * max|reference logit|. A flip at a
// larger margin needs the two competing logits to be off in opposite directions by more than half the
// bound each, which a run whose errors stay below half the bound (the defaults' headroom) cannot do.
double tie_margin_for(double atol, double rtol, const Reference& ref);
// sqrt(mean(logits^2)) over the whole reference: the scale rounding error is measured against.
double logit_rms(const Reference& ref);
// 2^-8 for bf16, 2^-11 for f16, 2^-24 for f32.
double unit_roundoff(DType t);

struct CheckOptions {
  Tolerance tol;
  uint64_t seed = 1;  // chunk splits
};

struct CaseResult {
  std::string mode;      // prefill | decode | chunked | batched | greedy
  double max_abs = 0;    // max |delta logit| (NaN if any logit was NaN)
  double mean_abs = 0;   // mean |delta logit| (NaN if any logit was NaN)
  bool allclose = true;  // every logit within atol + rtol*|ref|, none NaN
  bool mean_ok = true;   // mean_abs <= mean_atol
  int64_t agree = 0, total = 0;  // raw next-token (argmax) agreement, or greedy ids equal
  // The positions whose agreement is required: the reference's top-2 margin >= tie_margin (greedy: the
  // steps up to a row's first difference at a step whose margin is below it). All when tie_margin is 0.
  int64_t agree_required = 0, required = 0;
  int64_t compared = 0;  // logits compared (for the mean)
  bool passed() const { return allclose && mean_ok && agree_required == required; }
};

// Capacity and batch the check needs from the model.
int64_t reference_capacity(const Reference& ref);

std::vector<CaseResult> run_reference_check(Model& model, const Reference& ref, const CheckOptions& opt);

}  // namespace ingot
