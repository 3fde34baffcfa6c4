// What the kernel design labs (gemv_lab.cu, int4_lab.cu, sample_lab.cu) share: a CUDA error check that
// ends the run, and a named design (a launch of one kernel instance) with its S/U/R/P name.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

namespace ingot::lab {

inline void ck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// One design of a product kernel: S warps per row (or tile), U 16-byte loads in flight per lane, R rows
// (or tiles) per block, P the next step's loads issued before this step's math.
template <typename Args>
struct Design {
  std::string name;
  std::function<void(const Args&, cudaStream_t)> launch;
};

inline std::string design_name(int S, int U, int R, bool P) {
  return "S" + std::to_string(S) + " U" + std::to_string(U) + " R" + std::to_string(R) + (P ? " P" : "");
}

}  // namespace ingot::lab
