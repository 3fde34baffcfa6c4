// Checks of the parts of a ModelSpec that config.json and engine metadata both carry and that size
// kernels: the linear-attention layers' heads, head dims and conv kernel.
#include "models/spec.h"

#include "core/error.h"

namespace ingot {

void check_linear_spec(const ModelSpec& s, const std::string& where) {
  const LinearAttnSpec& l = s.linear;
  auto bound = [&](const char* field, int64_t v, int64_t lo, int64_t hi, const char* why) {
    if (v < lo || v > hi)
      throw Error(where + ": " + field + " is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]" + why);
  };
  bound("linear_num_key_heads", l.k_heads, 1, kMaxLinearHeads, "");
  bound("linear_num_value_heads", l.v_heads, 1, kMaxLinearHeads, "");
  bound("linear_key_head_dim", l.k_dim, 1, kMaxLinearKeyDim, " (the most the recurrent kernels hold per head)");
  bound("linear_value_head_dim", l.v_dim, 1, kMaxLinearValueDim, "");
  bound("linear_conv_kernel_dim", l.conv_kernel, 2, kMaxConvKernel, " (the conv kernels take 2 to 8 taps)");
  if (l.v_heads % l.k_heads != 0)
    throw Error(where + ": linear_num_value_heads " + std::to_string(l.v_heads) +
                " is not a multiple of linear_num_key_heads " + std::to_string(l.k_heads) +
                " (each key head serves the same number of value heads)");
  if (int64_t(s.kinds.size()) != s.layers)
    throw Error(where + ": " + std::to_string(s.kinds.size()) + " layer kinds for " + std::to_string(s.layers) + " layers");
}

}  // namespace ingot
