// Parity against a transformers reference file (docs/reference-format.md): the reference's rows are
// replayed through every path of the one forward (full prefill, token-by-token decode, random chunk
// splits, all rows batched at different write indices) and the greedy continuation is regenerated.
#pragma once
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
  int64_t rows() const { return input_ids.shape()[0]; }
  int64_t seq() const { return input_ids.shape()[1]; }
  int64_t vocab() const { return logits.shape()[2]; }
  int64_t greedy_new() const { return greedy_ids.shape()[1] - greedy_prompt_len; }
};

Reference load_reference(const std::string& path);  // throws Error naming the file and tensor

struct CheckOptions {
  double atol = 1e-4, rtol = 1e-4;
  uint64_t seed = 1;  // chunk splits
};

struct CaseResult {
  std::string mode;      // prefill | decode | chunked | batched | greedy
  double max_abs = 0;    // max |Δlogit| (NaN if any logit was NaN)
  bool allclose = true;  // every logit within atol + rtol*|ref|, none NaN
  int64_t agree = 0, total = 0;  // next-token (argmax) agreement, or greedy ids equal
  bool passed() const { return allclose && agree == total; }
};

// Capacity and batch the check needs from the model.
int64_t reference_capacity(const Reference& ref);

std::vector<CaseResult> run_reference_check(Model& model, const Reference& ref, const CheckOptions& opt);

}  // namespace ingot
