// y = x w^T (+bias) for 1..8 tokens: a weight-streaming kernel (cuBLASLt's GEMM tiles waste most of
// their work at this size). Each warp owns kRows output rows, reads them with 16-byte loads, several
// in flight per lane, and keeps the tokens' partial sums in registers; x is re-read from L1/L2.
// Weights depend on no earlier kernel, so the head of each row is prefetched into L2 before waiting
// for the previous kernel (programmatic dependent launch): the stream's ramp-up overlaps its drain.
// Accumulation is f32 in a fixed order, so results do not depend on launch or graph replay.
#include "backend/cuda/vec.cuh"

namespace ingot::cuda {
namespace {

constexpr int kRows = 1;     // output rows per warp (small N still fills every SM)
constexpr int kUnroll = 4;   // 16-byte weight loads in flight per row and lane
constexpr int kWarps = 4;
constexpr int kPrefetchBytes = 4096;  // per row, before the dependency wait

struct GemvArgs {
  const void* x;
  int64_t x_ld;
  const void* w;
  int64_t w_ld;
  const void* bias;
  void* y;
  int64_t y_ld;
  int T, N, K;
};

template <typename T, int NT>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a) {
  constexpr int V = 16 / int(sizeof(T));  // elements per 16-byte load
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * kWarps + warp) * kRows;
  const T* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    wr[r] = static_cast<const T*>(a.w) + int64_t(min(n0 + r, a.N - 1)) * a.w_ld;
    const int64_t head = a.K < kPrefetchBytes / int(sizeof(T)) ? a.K : kPrefetchBytes / int(sizeof(T));
    for (int64_t k = int64_t(lane) * 128 / int(sizeof(T)); k < head; k += 32 * 128 / int(sizeof(T)))
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + k));
  }
  pdl_wait();
  pdl_trigger();
  if (n0 >= a.N) return;
  const T* x = static_cast<const T*>(a.x);

  float acc[NT][kRows];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[t][r] = 0.f;

  constexpr int step = 32 * V;
  int k = lane * V;
  for (; k + (kUnroll - 1) * step < a.K; k += kUnroll * step) {
    float wv[kUnroll][kRows][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r) load_f<T, V, true>(wr[r] + k + u * step, wv[u][r]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float xv[V];
        load_f<T, V, true>(x + int64_t(t) * a.x_ld + k + u * step, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int i = 0; i < V; ++i) acc[t][r] += wv[u][r][i] * xv[i];
      }
    }
  }
  for (; k < a.K; k += step) {
    float wv[kRows][V];
#pragma unroll
    for (int r = 0; r < kRows; ++r) load_f<T, V, true>(wr[r] + k, wv[r]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
      float xv[V];
      load_f<T, V, true>(x + int64_t(t) * a.x_ld + k, xv);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[t][r] += wv[r][i] * xv[i];
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int o = 16; o > 0; o >>= 1) acc[t][r] += __shfl_xor_sync(0xffffffffu, acc[t][r], o);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int n = n0 + r;
        if (n >= a.N) break;
        float v = acc[t][r];
        if (a.bias) v += to_f(static_cast<const T*>(a.bias)[n]);
        static_cast<T*>(a.y)[int64_t(t) * a.y_ld + n] = from_f<T>(v);
      }
    }
  }
}

template <typename T, int NT>
void launch_nt(const GemvArgs& a, cudaStream_t s) {
  const unsigned blocks = unsigned((a.N + kWarps * kRows - 1) / (kWarps * kRows));
  launch("gemv_kernel", gemv_kernel<T, NT>, dim3(blocks), dim3(kWarps * 32), 0, s, a);
}

}  // namespace

bool launch_gemv(const Mat& x, const Mat& w, const void* bias, const Mat& y, cudaStream_t s) {
  if (x.rows < 1 || x.rows > 8 || x.dtype != w.dtype || y.dtype != w.dtype) return false;
  const int64_t V = 16 / int64_t(dtype_size(w.dtype));
  auto aligned = [&](const void* p, int64_t ld) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % V == 0;
  };
  if (w.cols % V != 0 || !aligned(w.data, w.ld) || !aligned(x.data, x.ld) || w.rows > INT32_MAX || w.cols > INT32_MAX)
    return false;
  GemvArgs a{x.data, x.ld, w.data, w.ld, bias, y.data, y.ld, int(x.rows), int(w.rows), int(w.cols)};
  dispatch(w.dtype, "linear", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    switch (a.T) {
      case 1: launch_nt<T, 1>(a, s); break;
      case 2: launch_nt<T, 2>(a, s); break;
      case 3: launch_nt<T, 3>(a, s); break;
      case 4: launch_nt<T, 4>(a, s); break;
      case 5: launch_nt<T, 5>(a, s); break;
      case 6: launch_nt<T, 6>(a, s); break;
      case 7: launch_nt<T, 7>(a, s); break;
      default: launch_nt<T, 8>(a, s); break;
    }
  });
  return true;
}

}  // namespace ingot::cuda
