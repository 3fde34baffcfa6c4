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
  int min_tokens = 1, max_tokens = 1 << 30;  // the token counts it is timed at
  int min_group = 0;                          // the smallest group size it takes (int4_lab)
  bool needs_sym = false;                     // weights without zero points only (int4_lab)
  int layout = 0;  // the weights' layout (int4_lab): 0 rows, 1 int4_stream_lab.cuh's tiles, 2 its 8-row blocks,
                   // 3 8-row blocks with paired nibbles
  bool exact = false;  // checked against the product of the unrounded weights (int4_lab)
};

// Milliseconds the work fn() enqueues on stream s takes (events around it).
template <typename F>
float time_ms(cudaStream_t s, F&& fn) {
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  ck(cudaEventRecord(e0, s), "record");
  fn();
  ck(cudaEventRecord(e1, s), "record");
  ck(cudaEventSynchronize(e1), "sync");
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  ck(cudaEventDestroy(e0), "event");
  ck(cudaEventDestroy(e1), "event");
  return ms;
}

// The device's copy bandwidth in GB/s (read + write counted), the ceiling a lab's GB/s are read
// against: five device-to-device copies of `bytes` on stream s after one warm-up.
inline double copy_bandwidth_gbs(cudaStream_t s, size_t bytes) {
  void *a, *b;
  ck(cudaMalloc(&a, bytes), "malloc");
  ck(cudaMalloc(&b, bytes), "malloc");
  ck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy");
  const float ms = time_ms(s, [&] {
    for (int i = 0; i < 5; ++i) ck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy");
  });
  ck(cudaFree(a), "free");
  ck(cudaFree(b), "free");
  return 2.0 * double(bytes) * 5 / (double(ms) * 1e-3) / 1e9;
}

// Milliseconds for `reps` replays of graph g on stream s.
inline float replay_ms(cudaGraphExec_t g, int reps, cudaStream_t s) {
  return time_ms(s, [&] {
    for (int i = 0; i < reps; ++i) ck(cudaGraphLaunch(g, s), "replay");
  });
}

// Whether a lab runs `name`: every name unless the environment variable `var` (INGOT_LAB_SHAPE,
// INGOT_LAB_DESIGN) is set, then only the names it lists (comma-separated). Lets a profiler (ncu) see
// one kernel, or a short device call run a few shapes.
// An entry ending in '*' takes every name that starts with the rest ("G *": all of int4_lab's GEMMs).
inline bool selected(const char* var, const std::string& name) {
  const char* only = std::getenv(var);
  if (!only || !*only) return true;
  const std::string list = only;
  for (size_t b = 0; b <= list.size();) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    const std::string item = list.substr(b, e - b);
    if (item == name || (!item.empty() && item.back() == '*' && name.rfind(item.substr(0, item.size() - 1), 0) == 0))
      return true;
    b = e + 1;
  }
  return false;
}

inline std::string design_name(int S, int U, int R, bool P) {
  return "S" + std::to_string(S) + " U" + std::to_string(U) + " R" + std::to_string(R) + (P ? " P" : "");
}

}  // namespace ingot::lab
