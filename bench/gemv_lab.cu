// GEMV design lab (issue 16): the one-token product kernel of the library (src/backend/cuda/
// gemv_kernel.cuh) in several splits of its rows, timed as a decode step runs them (a CUDA graph of one
// launch per layer over distinct weights, so every call streams its weight from HBM; programmatic
// dependent launch on), at the decode shapes of Qwen3-8B, Qwen3-0.6B and Llama-3.1-8B, bf16. Every
// design is checked against a double-precision host product of the same values. One GPU call measures
// the whole design space; gemv.cu's choice by K came from it (docs/performance.md, "Latest figures").
//   cmake --build build-gpu/tree --target gemv_lab && build-gpu/tree/gemv_lab [replays]
// INGOT_LAB_SHAPE=8b.o and INGOT_LAB_DESIGN="S4 U4 R2" run one shape / design only (e.g. under ncu).
// Designs: S warps per output row, U 16-byte loads in flight per lane, R rows per block, P the next
// step's loads issued before this step's math. The lab of commit 53e6928 also timed persistent grids
// and an RMSNorm prologue folded into the product; both lost and were dropped (the figures are in
// docs/performance.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemv_kernel.cuh"
#include "lab_util.h"

namespace {

using bf16 = __nv_bfloat16;
using ingot::cuda::gemv::GemvArgs;

using ingot::lab::ck;
using Design = ingot::lab::Design<GemvArgs>;

template <int S, int U, int R, bool P, bool SW>
Design design() {
  Design d;
  d.name = ingot::lab::design_name(S, U, R, P);
  d.launch = [](const GemvArgs& a, cudaStream_t s) {
    ingot::cuda::launch("gemv_lab", ingot::cuda::gemv::kernel<bf16, S, U, R, P, SW, false>, dim3(unsigned((a.N + R - 1) / R)),
                        dim3(R * S * 32), 0, s, a);
  };
  return d;
}

// The one-warp kernel the split replaced first, then the splits gemv.cu uses and their neighbours.
template <bool SW>
std::vector<Design> designs() {
  return {design<1, 4, 4, false, SW>(), design<1, 4, 4, true, SW>(), design<1, 2, 4, true, SW>(),
          design<2, 4, 2, false, SW>(), design<2, 2, 2, true, SW>(), design<4, 4, 2, false, SW>(),
          design<4, 4, 1, false, SW>(), design<4, 2, 1, true, SW>(), design<8, 4, 1, false, SW>()};
}

struct Shape {
  const char* name;
  int N, K;
  bool swiglu;  // w is [2N, K]: gate rows, then up rows
  int layers;   // distinct weights in the graph
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Shape> shapes = {
      {"8b.qkv", 6144, 4096, false, 36},    {"8b.o", 4096, 4096, false, 36},
      {"8b.gateup", 12288, 4096, true, 36}, {"8b.down", 4096, 12288, false, 36},
      {"8b.head", 151936, 4096, false, 2},  {"0.6b.qkv", 4096, 1024, false, 28},
      {"0.6b.o", 1024, 2048, false, 28},    {"0.6b.gateup", 3072, 1024, true, 28},
      {"0.6b.down", 1024, 3072, false, 28}, {"0.6b.head", 151936, 1024, false, 4},
      {"l8b.gateup", 14336, 4096, true, 32}, {"l8b.down", 4096, 14336, false, 32},
  };
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  std::printf("copy bandwidth: %.0f GB/s\n", ingot::lab::copy_bandwidth_gbs(s, size_t(2) << 30));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::printf("%-12s %-12s %9s %9s %9s\n", "shape", "design", "us/call", "GB/s", "max rel");
  for (const Shape& sh : shapes) {
    if (!ingot::lab::selected("INGOT_LAB_SHAPE", sh.name)) continue;
    const int rows = sh.swiglu ? 2 * sh.N : sh.N;
    const size_t welems = size_t(rows) * size_t(sh.K);
    std::vector<bf16> hw(welems), hx(size_t(sh.K));  // [rows, K], [K]
    for (auto& v : hw) v = __float2bfloat16_rn(nd(rng) * 0.05f);
    for (auto& v : hx) v = __float2bfloat16_rn(nd(rng));
    std::vector<bf16*> w(size_t(sh.layers));
    for (auto& p : w) {
      ck(cudaMalloc(&p, welems * 2), "malloc");
      ck(cudaMemcpy(p, hw.data(), welems * 2, cudaMemcpyHostToDevice), "upload");
    }
    bf16 *x, *y;  // [K], [N]
    ck(cudaMalloc(&x, size_t(sh.K) * 2), "malloc");
    ck(cudaMalloc(&y, size_t(sh.N) * 2), "malloc");
    ck(cudaMemcpy(x, hx.data(), size_t(sh.K) * 2, cudaMemcpyHostToDevice), "upload");
    auto dot = [&](int row) {
      double acc = 0;
      for (int k = 0; k < sh.K; ++k)
        acc += double(__bfloat162float(hw[size_t(row) * sh.K + k])) * __bfloat162float(hx[size_t(k)]);
      return acc;
    };
    std::vector<double> ref(size_t(sh.N));  // every 97th output
    for (int n = 0; n < sh.N; n += 97) {
      if (!sh.swiglu) {
        ref[size_t(n)] = dot(n);
      } else {
        const double g = dot(n), u = dot(n + sh.N);
        ref[size_t(n)] = g / (1 + std::exp(-g)) * u;
      }
    }
    for (const Design& d : sh.swiglu ? designs<true>() : designs<false>()) {
      if (!ingot::lab::selected("INGOT_LAB_DESIGN", d.name)) continue;
      ck(cudaMemset(y, 0, size_t(sh.N) * 2), "memset");
      cudaGraph_t g;
      cudaGraphExec_t ge;
      ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
      for (int l = 0; l < sh.layers; ++l) d.launch(GemvArgs{x, w[size_t(l)], sh.K, nullptr, y, sh.N, sh.K}, s);
      ck(cudaStreamEndCapture(s, &g), "capture");
      ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
      ck(cudaGraphLaunch(ge, s), "replay");
      ck(cudaStreamSynchronize(s), "sync");
      std::vector<bf16> hy(size_t(sh.N));
      ck(cudaMemcpy(hy.data(), y, size_t(sh.N) * 2, cudaMemcpyDeviceToHost), "download");
      double worst = 0;
      for (int n = 0; n < sh.N; n += 97) {
        const double r = ref[size_t(n)], v = __bfloat162float(hy[size_t(n)]);
        const double rel = std::fabs(v - r) / (std::fabs(r) + 1e-2);
        if (!(rel <= worst)) worst = rel == rel ? rel : 1e9;  // NaN never passes
      }
      const float ms = ingot::lab::replay_ms(ge, reps, s);
      const double us = ms * 1e3 / (reps * sh.layers);
      std::printf("%-12s %-12s %9.2f %9.0f %9.4f%s\n", sh.name, d.name.c_str(), us, welems * 2 / (us * 1e-6) / 1e9,
                  worst, worst > 0.02 ? "  WRONG" : "");
      ck(cudaGraphExecDestroy(ge), "destroy");
      ck(cudaGraphDestroy(g), "destroy");
    }
    for (auto p : w) ck(cudaFree(p), "free");
    ck(cudaFree(x), "free");
    ck(cudaFree(y), "free");
  }
  return 0;
}
