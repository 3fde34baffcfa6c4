// CPU reference of the linear-attention (Gated DeltaNet) ops; the CPU backend forwards to these.
#pragma once
#include "backend/backend.h"

namespace ingot::cpu {

void causal_conv1d(const CausalConv1dParams& p, int threads);
void gated_delta_rule(const GatedDeltaRuleParams& p, int threads);
void gated_rmsnorm(const GatedRmsNormParams& p, int threads);

}  // namespace ingot::cpu
