// GEMV design lab (issue 16): one-token bf16 products y = x w^T at the decode shapes, timed as a decode
// step runs them (a CUDA graph of one launch per layer over distinct weights, programmatic dependent
// launch on), for several kernel designs, so one GPU call measures the whole design space and the
// library kernel (src/backend/cuda/gemv.cu) takes the winner per shape. Written by us; standalone:
//   cmake --build build-gpu/tree --target gemv_lab && build-gpu/tree/gemv_lab [replays]   (or nvcc -O3 -std=c++17
//   -arch=sm_90 bench/gemv_lab.cu -o gemv_lab). Its figures of 2026-12-02 are in docs/performance.md.
// Designs (template parameters of one kernel):
//   S  warps per output row (split of K inside the block, partial sums reduced through shared memory
//      in a fixed order, so the result does not depend on timing);
//   U  16-byte loads in flight per lane per step;
//   R  output rows per block (blocks of R*S warps);
//   P  software pipelining: the next step's loads are issued before the current step's math;
//   G  a persistent grid (a few blocks per SM looping over the rows);
//   +norm  the RMSNorm folded in as a prologue of every block (the rmsnorm kernel + product pair is
//      timed beside it: the prologue sits on every block's critical path and lost on every shape).
// Every design is checked against a double-precision host product of the same bf16 values.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

using bf16 = __nv_bfloat16;

// Programmatic dependent launch exists from sm_90 (the lab's target); no-ops for older architectures.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void widen(const uint4& raw, float (&out)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

struct Args {
  const bf16* x;  // [K]; with the norm prologue, the residual to normalise
  const bf16* norm_w;  // [K] RMSNorm weight (norm prologue only)
  float eps;
  const bf16* w;  // [N (x2 for swiglu), K]
  bf16* y;        // [N]
  int N, K;
};

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

template <int S, int U, int R, bool P, bool SW>
__device__ __forceinline__ void gemv_rows(const Args& a, const bf16* xs, int grp, bool first) {
  constexpr int V = 8;
  constexpr int RW = SW ? 2 : 1;  // weight rows per output
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int r = warp / S, part = warp % S;
  const int n = grp * R + r;
  const int nn = n < a.N ? n : a.N - 1;
  const bf16* wr[RW];
#pragma unroll
  for (int q = 0; q < RW; ++q) wr[q] = a.w + (int64_t(nn) + int64_t(q) * a.N) * a.K;
  // Prefetch the head of this warp's share into L2 before the dependency wait.
  {
    const int head = a.K < 2048 ? a.K : 2048;
#pragma unroll
    for (int q = 0; q < RW; ++q)
      for (int k = (part * 32 + lane) * 64; k < head; k += S * 32 * 64)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[q] + k));
  }
  if (first) {
    pdl_wait();
    pdl_trigger();
  }
  float acc[RW];
#pragma unroll
  for (int q = 0; q < RW; ++q) acc[q] = 0.f;
  constexpr int step = S * 32 * V;  // elements the S warps cover per load slot
  const int k0 = (part * 32 + lane) * V;
  auto math = [&](const uint4 (&raw)[U][RW], int k, bool tail) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * step;
      if (tail && kk >= a.K) break;
      float xv[V];
      widen(*reinterpret_cast<const uint4*>(xs + kk), xv);
#pragma unroll
      for (int q = 0; q < RW; ++q) {
        float wv[V];
        widen(raw[u][q], wv);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[q] += wv[i] * xv[i];
      }
    }
  };
  auto load = [&](uint4 (&raw)[U][RW], int k, bool tail) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < RW; ++q) {
        const int kk = k + u * step;
        if (!tail || kk < a.K)
          raw[u][q] = __ldg(reinterpret_cast<const uint4*>(wr[q] + kk));
        else
          raw[u][q] = make_uint4(0, 0, 0, 0);
      }
  };
  if constexpr (!P) {
    int k = k0;
    for (; k + (U - 1) * step < a.K; k += U * step) {
      uint4 raw[U][RW];
      load(raw, k, false);
      math(raw, k, false);
    }
    if (k < a.K) {
      uint4 raw[U][RW];
      load(raw, k, true);
      math(raw, k, true);
    }
  } else {
    uint4 A[U][RW], B[U][RW];
    int k = k0;
    load(A, k, true);
    while (k < a.K) {
      const int kn = k + U * step;
      if (kn < a.K) load(B, kn, true);
      math(A, k, true);
      k = kn;
      if (k >= a.K) break;
      const int kn2 = k + U * step;
      if (kn2 < a.K) load(A, kn2, true);
      math(B, k, true);
      k = kn2;
    }
  }
#pragma unroll
  for (int q = 0; q < RW; ++q)
    for (int o = 16; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
  if constexpr (S > 1) {
    __shared__ float part_sum[R][S][RW];
    if (lane == 0)
#pragma unroll
      for (int q = 0; q < RW; ++q) part_sum[r][part][q] = acc[q];
    __syncthreads();
#pragma unroll
    for (int q = 0; q < RW; ++q) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < S; ++p) s += part_sum[r][p][q];
      acc[q] = s;
    }
    __syncthreads();  // part_sum is reused by the next row group
    if (part != 0) return;
  }
  if (lane == 0 && n < a.N) {
    float v;
    if constexpr (SW) {
      const float g = __bfloat162float(__float2bfloat16_rn(acc[0]));
      const float u = __bfloat162float(__float2bfloat16_rn(acc[1]));
      v = silu_mul(g, u);
    } else {
      v = acc[0];
    }
    a.y[n] = __float2bfloat16_rn(v);
  }
}

// The add_rmsnorm kernel of the library (512 threads, one token): the unfused baseline.
__global__ void __launch_bounds__(512) rmsnorm512(const bf16* x, const bf16* w, float eps, bf16* out, int cols) {
  pdl_wait();
  pdl_trigger();
  float ss = 0.f;
  for (int i = threadIdx.x; i < cols; i += 512) {
    const float v = __bfloat162float(x[i]);
    ss += v * v;
  }
  __shared__ float red[16];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < 16 ? red[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(red[0] / float(cols) + eps);
  for (int i = threadIdx.x; i < cols; i += 512)
    out[i] = __float2bfloat16_rn(__bfloat162float(w[i]) * (__bfloat162float(x[i]) * inv));
}

// The norm prologue: the block (NT threads, NT dividing 512) computes rmsnorm(x) * w into shared
// memory with the 512-thread kernel's exact summation order (virtual thread i of 512 = real thread
// i % NT, accumulator i / NT), so the normalised row is bitwise the unfused one.
template <int NT>
__device__ __forceinline__ void norm_prologue(const Args& a, bf16* xs) {
  constexpr int VA = 512 / NT;  // virtual threads per real thread
  float ss[VA];
#pragma unroll
  for (int j = 0; j < VA; ++j) ss[j] = 0.f;
  for (int base = 0; base < a.K; base += 512)
#pragma unroll
    for (int j = 0; j < VA; ++j) {
      const int i = base + j * NT + int(threadIdx.x);
      if (i < a.K) {
        const float v = __bfloat162float(a.x[i]);
        ss[j] += v * v;
      }
    }
  __shared__ float red[16];
#pragma unroll
  for (int j = 0; j < VA; ++j) {
    for (int o = 16; o > 0; o >>= 1) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
    if ((threadIdx.x & 31) == 0) red[(j * NT + int(threadIdx.x)) / 32] = ss[j];
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < 16 ? red[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(red[0] / float(a.K) + a.eps);
  for (int i = threadIdx.x; i < a.K; i += NT)
    xs[i] = __float2bfloat16_rn(__bfloat162float(a.norm_w[i]) * (__bfloat162float(a.x[i]) * inv));
  __syncthreads();
}

template <int S, int U, int R, bool P, bool SW, bool G, bool NORM>
__global__ void __launch_bounds__(R * S * 32) gemv(Args a) {
  // G: a persistent grid (a few blocks per SM) looping over row groups; otherwise one row group per block.
  const int groups = (a.N + R - 1) / R;
  extern __shared__ __align__(16) unsigned char smem[];
  const bf16* xs = a.x;
  bool first = true;
  for (int grp = blockIdx.x; grp < groups; grp += G ? gridDim.x : groups) {
    if (NORM && first) {
      // Prefetch this block's first rows, then wait for x and normalise it once per block.
      const int n = min(grp * R + int(threadIdx.x) / (S * 32), a.N - 1);
      for (int k = (int(threadIdx.x) % (S * 32)) * 64; k < min(a.K, 2048); k += S * 32 * 64)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + int64_t(n) * a.K + k));
      pdl_wait();
      pdl_trigger();
      norm_prologue<R * S * 32>(a, reinterpret_cast<bf16*>(smem));
      xs = reinterpret_cast<const bf16*>(smem);
      first = false;
    }
    gemv_rows<S, U, R, P, SW>(a, xs, grp, first);
    first = false;
  }
}

struct Design {
  std::string name;
  std::function<void(const Args&, cudaStream_t)> launch;
};

template <int S, int U, int R, bool P, bool SW, bool G = false, bool NORM = false>
Design make_design() {
  Design d;
  d.name = "S" + std::to_string(S) + "U" + std::to_string(U) + "R" + std::to_string(R) + (P ? "P" : "-") +
           (G ? "G" : "") + (NORM ? "+norm" : "");
  int per_sm = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv<S, U, R, P, SW, G, NORM>, R * S * 32, NORM ? 8192 : 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  d.name += "(" + std::to_string(per_sm) + ")";
  d.launch = [per_sm, sms](const Args& a, cudaStream_t s) {
    cudaLaunchConfig_t cfg{};
    const int groups = (a.N + R - 1) / R;
    cfg.gridDim = dim3(unsigned(G ? std::min(groups, per_sm * sms) : groups));
    cfg.blockDim = dim3(R * S * 32);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.dynamicSmemBytes = NORM ? size_t(a.K) * 2 : 0;
    CK(cudaLaunchKernelEx(&cfg, gemv<S, U, R, P, SW, G, NORM>, a));
  };
  return d;
}

template <bool SW>
std::vector<Design> designs() {
  std::vector<Design> v;
  v.push_back(make_design<1, 4, 4, false, SW>());  // the library kernel today
  v.push_back(make_design<1, 2, 4, true, SW>());
  v.push_back(make_design<1, 4, 4, true, SW>());
  v.push_back(make_design<1, 8, 4, false, SW>());
  v.push_back(make_design<2, 4, 2, false, SW>());
  v.push_back(make_design<2, 2, 2, true, SW>());
  v.push_back(make_design<2, 4, 2, true, SW>());
  v.push_back(make_design<4, 4, 1, false, SW>());
  v.push_back(make_design<4, 2, 1, true, SW>());
  v.push_back(make_design<4, 4, 1, true, SW>());
  v.push_back(make_design<4, 4, 2, false, SW>());
  v.push_back(make_design<8, 4, 1, false, SW>());
  v.push_back(make_design<8, 2, 1, true, SW>());
  v.push_back(make_design<2, 8, 2, false, SW>());
  v.push_back(make_design<1, 4, 8, false, SW>());
  v.push_back(make_design<1, 4, 2, false, SW>());
  v.push_back(make_design<1, 4, 4, false, SW, true>());
  v.push_back(make_design<2, 4, 2, false, SW, true>());
  v.push_back(make_design<4, 4, 1, false, SW, true>());
  v.push_back(make_design<4, 2, 1, true, SW, true>());
  v.push_back(make_design<2, 2, 2, true, SW, true>());
  return v;
}

template <bool SW>
std::vector<Design> norm_designs() {
  std::vector<Design> v;
  v.push_back(make_design<1, 4, 4, false, SW, false, true>());
  v.push_back(make_design<1, 4, 8, false, SW, false, true>());
  v.push_back(make_design<1, 4, 4, false, SW, true, true>());
  v.push_back(make_design<1, 4, 8, false, SW, true, true>());
  v.push_back(make_design<2, 4, 2, false, SW, true, true>());
  v.push_back(make_design<2, 4, 4, false, SW, true, true>());
  v.push_back(make_design<4, 4, 2, false, SW, true, true>());
  v.push_back(make_design<1, 2, 8, true, SW, true, true>());
  return v;
}

struct Shape {
  const char* name;
  int N, K;
  bool swiglu;
  int layers;
  bool norm = false;  // also time the rmsnorm + product pair against the fused norm prologue
};

static float bf2f(bf16 v) { return __bfloat162float(v); }

int main(int argc, char** argv) {
  std::vector<Shape> shapes = {
      {"8b.qkv", 6144, 4096, false, 36, true},    {"8b.o", 4096, 4096, false, 36},
      {"8b.gateup", 12288, 4096, true, 36, true}, {"8b.down", 4096, 12288, false, 36},
      {"8b.head", 151936, 4096, false, 2},  {"0.6b.qkv", 4096, 1024, false, 28, true},
      {"0.6b.o", 1024, 2048, false, 28},    {"0.6b.gateup", 3072, 1024, true, 28, true},
      {"0.6b.down", 1024, 3072, false, 28}, {"0.6b.head", 151936, 1024, false, 4},
      {"l8b.qkv", 6144, 4096, false, 32},   {"l8b.gateup", 14336, 4096, true, 32},
      {"l8b.down", 4096, 14336, false, 32},
  };
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  // Copy bandwidth (read + write counted), for the ratio.
  {
    const size_t bytes = size_t(2) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("copy bandwidth: %.0f GB/s\n", 2.0 * bytes * 5 / (ms * 1e-3) / 1e9);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::printf("%-12s %-18s %9s %9s %9s\n", "shape", "design", "us/call", "GB/s", "maxrel");
  for (const Shape& sh : shapes) {
    const int rows = sh.swiglu ? 2 * sh.N : sh.N;
    const size_t welems = size_t(rows) * sh.K;
    std::vector<bf16> hw(welems), hx(sh.K);
    for (auto& v : hw) v = __float2bfloat16_rn(nd(rng) * 0.05f);
    for (auto& v : hx) v = __float2bfloat16_rn(nd(rng));
    std::vector<bf16*> w(size_t(sh.layers));
    for (auto& p : w) {
      CK(cudaMalloc(&p, welems * 2));
      CK(cudaMemcpy(p, hw.data(), welems * 2, cudaMemcpyHostToDevice));
    }
    bf16 *x, *y;
    CK(cudaMalloc(&x, size_t(sh.K) * 2));
    CK(cudaMalloc(&y, size_t(sh.N) * 2));
    CK(cudaMemcpy(x, hx.data(), size_t(sh.K) * 2, cudaMemcpyHostToDevice));
    // Reference for a few rows.
    std::vector<double> ref(size_t(sh.N));
    for (int n = 0; n < sh.N; n += 97) {
      auto dot = [&](int row) {
        double acc = 0;
        for (int k = 0; k < sh.K; ++k) acc += double(bf2f(hw[size_t(row) * sh.K + k])) * bf2f(hx[size_t(k)]);
        return acc;
      };
      if (sh.swiglu) {
        const double g = dot(n), u = dot(n + sh.N);
        ref[size_t(n)] = g / (1 + std::exp(-g)) * u;
      } else {
        ref[size_t(n)] = dot(n);
      }
    }
    bf16 *nw, *xn;
    CK(cudaMalloc(&nw, size_t(sh.K) * 2));
    CK(cudaMalloc(&xn, size_t(sh.K) * 2));
    {
      std::vector<bf16> hn(size_t(sh.K));
      for (auto& v : hn) v = __float2bfloat16_rn(1.0f + 0.1f * nd(rng));
      CK(cudaMemcpy(nw, hn.data(), size_t(sh.K) * 2, cudaMemcpyHostToDevice));
    }
    std::vector<bf16> base_y;  // the unfused rmsnorm + S1U4R4 result, for the bitwise check
    // mode 0: plain product of x; 1: rmsnorm kernel then the product of its output; 2: fused norm prologue.
    auto time_design = [&](const Design& d, int mode) {
      CK(cudaMemset(y, 0, size_t(sh.N) * 2));
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < sh.layers; ++l) {
        if (mode == 1) {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(1);
          cfg.blockDim = dim3(512);
          cfg.stream = s;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = attr;
          cfg.numAttrs = 1;
          const bf16* cx = x;
          const bf16* cw = nw;
          CK(cudaLaunchKernelEx(&cfg, rmsnorm512, cx, cw, 1e-6f, xn, sh.K));
          d.launch(Args{xn, nullptr, 0.f, w[size_t(l)], y, sh.N, sh.K}, s);
        } else if (mode == 2) {
          d.launch(Args{x, nw, 1e-6f, w[size_t(l)], y, sh.N, sh.K}, s);
        } else {
          d.launch(Args{x, nullptr, 0.f, w[size_t(l)], y, sh.N, sh.K}, s);
        }
      }
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      std::vector<bf16> hy(size_t(sh.N));
      CK(cudaMemcpy(hy.data(), y, size_t(sh.N) * 2, cudaMemcpyDeviceToHost));
      double maxrel = 0;
      std::string note;
      if (mode == 0) {
        for (int n = 0; n < sh.N; n += 97) {
          const double r = ref[size_t(n)], v = bf2f(hy[size_t(n)]);
          const double rel = std::fabs(v - r) / (std::fabs(r) + 1e-2);
          if (!(rel == rel)) maxrel = 1e9;
          if (rel > maxrel) maxrel = rel;
        }
        if (maxrel > 0.02) note = "  WRONG";
      } else if (mode == 1) {
        base_y = hy;
      } else {
        int diff = 0;
        for (size_t i = 0; i < hy.size(); ++i)
          diff += std::memcmp(&hy[i], &base_y[i], 2) != 0;
        note = diff ? "  differs in " + std::to_string(diff) + " outputs" : "  bitwise";
      }
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / (reps * sh.layers);
      const std::string name = (mode == 1 ? "rms+" : "") + d.name;
      std::printf("%-12s %-18s %9.2f %9.0f %9.4f%s\n", sh.name, name.c_str(), us, welems * 2 / (us * 1e-6) / 1e9,
                  maxrel, note.c_str());
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    };
    const auto ds = sh.swiglu ? designs<true>() : designs<false>();
    for (const Design& d : ds) time_design(d, 0);
    if (sh.norm) {
      time_design(ds[0], 1);
      for (const Design& d : sh.swiglu ? norm_designs<true>() : norm_designs<false>()) time_design(d, 2);
    }
    CK(cudaFree(nw));
    CK(cudaFree(xn));
    for (auto p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  return 0;
}
